"""`make screenshots`: the inspector's main pages as PNG files, for docs/inspector.md.

Usage: python tests/support/inspector_screenshots.py [DIRECTORY] (default docs/images). Writes the
test scenario (support/inspector_scenario.py, with a real crash in another process) into a SQLite
file in a scratch directory, serves it, and has headless Chromium (/usr/bin/chromium) take each
page as `inspector-<name>.png`.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from playwright.sync_api import Page, sync_playwright

from step_persistence import SqliteStepStore
from support.inspector_scenario import Scenario, write_scenario
from support.inspector_server import serving

CHROMIUM = os.environ.get('STEP_PERSISTENCE_CHROMIUM', '/usr/bin/chromium')
FILLERS = 12
"""Older runs under the scenario's, so the list looks like a store in use."""


async def _finish(scenario: Scenario) -> None:
    scenario.release()
    await scenario.held_task


def _shoot(page: Page, url: str, path: Path, *, full_page: bool = True) -> None:
    page.goto(url)
    page.wait_for_load_state('networkidle')
    page.screenshot(path=str(path), full_page=full_page)
    print(f'wrote {path}')


def main(directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as scratch:
        os.chdir(scratch)  # the header shows the store as `sqlite:///runs.db`
        spec = {'backend': 'sqlite', 'database': str(Path(scratch, 'runs.db'))}
        with (
            serving(
                lambda: SqliteStepStore(Path(scratch, 'runs.db')),
                lambda store: write_scenario(store, crash_spec=spec, fillers=FILLERS),
                finish=_finish,
                store_url='sqlite:///runs.db',
            ) as site,
            sync_playwright() as driver,
        ):
            browser = driver.chromium.launch(executable_path=CHROMIUM, args=['--no-sandbox'])
            page = browser.new_page(viewport={'width': 1280, 'height': 800})
            crashed = site.facts.crashed_run
            snapshots = site.call(lambda: site.store.list_snapshots(run_id='image-run', include_interrupted=True))
            _shoot(page, site.url, directory / 'inspector-runs.png', full_page=False)
            _shoot(page, site.url + f'run?id={crashed}', directory / 'inspector-crashed-run.png')
            _shoot(page, site.url + 'run?id=orchestrator-run', directory / 'inspector-run.png')
            _shoot(
                page,
                site.url + f'run/messages?id=image-run&seq={snapshots[-1].seq}',
                directory / 'inspector-messages.png',
            )
            _shoot(page, site.url + 'conversation?id=conv-research', directory / 'inspector-conversation.png')
            browser.close()


if __name__ == '__main__':
    main(Path(sys.argv[1] if len(sys.argv) > 1 else 'docs/images').resolve())
