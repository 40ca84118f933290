"""Fixtures of the inspector's tests: one headless Chromium for the browser tests, and the scenario served per backend.

The browser is Debian's `/usr/bin/chromium` (`make chromium` installs it; Playwright's own
download is never used), launched once for the module of browser tests (per xdist worker) and
given a fresh context (cookies, storage) per test. Module-scoped, not session-scoped: while
Playwright's sync API is started, asyncio sees an event loop running in this thread, so an async
test run after it in the same worker could not start its own; the module's end stops it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, BrowserContext, Page, Playwright, sync_playwright

from step_persistence import FileStepStore, InMemoryStepStore, SqliteStepStore, StepStore
from support.inspector_scenario import Scenario, write_scenario
from support.inspector_server import Served, serving

CHROMIUM = Path(os.environ.get('STEP_PERSISTENCE_CHROMIUM', '/usr/bin/chromium'))

BROWSER_BACKENDS = ('sqlite', 'memory')
"""The browser tests run on these (one served store each, shared by a module's tests); every backend's
pages are checked without a browser in test_inspector_backends.py."""


@pytest.fixture(scope='module')
def playwright() -> Iterator[Playwright]:
    with sync_playwright() as driver:
        yield driver


@pytest.fixture(scope='module')
def browser(playwright: Playwright) -> Iterator[Browser]:
    if not CHROMIUM.exists():
        pytest.fail(f'no Chromium at {CHROMIUM}: run `make chromium` (apt-get install chromium)')
    launched = playwright.chromium.launch(executable_path=str(CHROMIUM), args=['--no-sandbox'], headless=True)
    yield launched
    launched.close()


@pytest.fixture
def context(browser: Browser) -> Iterator[BrowserContext]:
    fresh = browser.new_context(viewport={'width': 1280, 'height': 900})
    fresh.set_default_timeout(10_000)
    yield fresh
    fresh.close()


@pytest.fixture
def page(context: BrowserContext) -> Page:
    return context.new_page()


def open_backend(name: str, root: Path) -> tuple[StepStore, str, dict[str, Any] | None]:
    """A store of backend `name` under `root`, its URL, and how another process opens it (`None`: it cannot)."""
    if name == 'sqlite':
        database = root / 'runs.db'
        return SqliteStepStore(database), f'sqlite:///{database}', {'backend': 'sqlite', 'database': str(database)}
    if name == 'file':
        directory = root / 'runs'
        return FileStepStore(directory), f'file://{directory}', {'backend': 'file', 'directory': str(directory)}
    return InMemoryStepStore(), 'memory://', None


async def _finish(scenario: Scenario) -> None:
    scenario.release()
    await scenario.held_task


@pytest.fixture(scope='module', params=BROWSER_BACKENDS)
def site(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served[Scenario]]:
    """The scenario on one backend, served until the module's tests are done (they must not change it)."""
    store, url, spec = open_backend(request.param, tmp_path_factory.mktemp(f'inspector-{request.param}'))
    with serving(
        lambda: store,
        lambda opened: write_scenario(opened, crash_spec=spec),
        finish=_finish,
        store_url=url,
        refresh_seconds=0.1,
    ) as served:
        yield served
