"""The deployment route without a checkout: an installed wheel and a minimal `alembic.ini`.

The wheel is built from this tree and installed into a fresh virtual environment, so the test
sees what a user's deployment sees (the packaged `env.py` and revisions), not the checkout.
"""

from __future__ import annotations

import sqlite3
import sys
from pathlib import Path

import pytest

from support.wheel import ROOT, UV, build_wheel, run

MIGRATIONS = sorted(
    path.stem.split('_', 1)[0][1:] for path in (ROOT / 'src/step_persistence/migrations/versions').glob('v*.py')
)


@pytest.fixture(scope='module')
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The `bin/` of a fresh virtual environment with the wheel of this tree installed."""
    scratch = tmp_path_factory.mktemp('wheel')
    wheel = build_wheel(scratch)
    run(*UV, 'venv', '--quiet', '--python', sys.executable, scratch / 'venv', cwd=scratch)
    run(*UV, 'pip', 'install', '--quiet', '--python', scratch / 'venv/bin/python', wheel, cwd=scratch)
    return scratch / 'venv/bin'


def test_alembic_upgrades_from_a_minimal_ini_with_the_installed_package(installed: Path, tmp_path: Path) -> None:
    (tmp_path / 'alembic.ini').write_text('[alembic]\nscript_location = step_persistence:migrations\n')
    run(installed / 'alembic', '-x', 'url=sqlite:///runs.db', 'upgrade', 'head', cwd=tmp_path)
    current = run(installed / 'alembic', '-x', 'url=sqlite:///runs.db', 'current', cwd=tmp_path)
    assert f'{MIGRATIONS[-1]} (head)' in current.stdout
    with sqlite3.connect(tmp_path / 'runs.db') as connection:
        tables = {name for (name,) in connection.execute("select name from sqlite_master where type = 'table'")}
    assert {'runs', 'events', 'snapshots', 'tool_effects', 'messages', 'media'} <= tables
    located = run(installed / 'python', '-c', 'import step_persistence; print(step_persistence.__file__)', cwd=tmp_path)
    assert str(ROOT) not in located.stdout, 'the test must use the installed wheel, not the checkout'
