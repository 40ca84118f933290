"""The deployment route without a checkout: an installed wheel and a minimal `alembic.ini`.

The wheel is built from this tree and installed into a fresh virtual environment, so the test
sees what a user's deployment sees (the packaged `env.py` and revisions), not the checkout.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
UV = [os.environ.get('UV') or shutil.which('uv') or 'uv']
"""The uv that runs the tests (`uv run` names itself in `UV`)."""
MIGRATIONS = sorted(
    path.stem.split('_', 1)[0][1:] for path in (ROOT / 'src/step_persistence/migrations/versions').glob('v*.py')
)


def _run(*command: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, 'UV_PYTHON_DOWNLOADS': 'never'}
    environment.pop('VIRTUAL_ENV', None)
    completed = subprocess.run(
        [str(part) for part in command], cwd=cwd, capture_output=True, text=True, timeout=300, env=environment
    )
    assert completed.returncode == 0, (command, completed.stdout, completed.stderr)
    return completed


@pytest.fixture(scope='module')
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The `bin/` of a fresh virtual environment with the wheel of this tree installed."""
    scratch = tmp_path_factory.mktemp('wheel')
    _run(*UV, 'build', '--wheel', '--out-dir', scratch / 'dist', ROOT, cwd=scratch)
    [wheel] = (scratch / 'dist').glob('step_persistence-*.whl')
    _run(*UV, 'venv', '--quiet', '--python', sys.executable, scratch / 'venv', cwd=scratch)
    _run(*UV, 'pip', 'install', '--quiet', '--python', scratch / 'venv/bin/python', wheel, cwd=scratch)
    return scratch / 'venv/bin'


def test_alembic_upgrades_from_a_minimal_ini_with_the_installed_package(installed: Path, tmp_path: Path) -> None:
    (tmp_path / 'alembic.ini').write_text('[alembic]\nscript_location = step_persistence:migrations\n')
    _run(installed / 'alembic', '-x', 'url=sqlite:///runs.db', 'upgrade', 'head', cwd=tmp_path)
    current = _run(installed / 'alembic', '-x', 'url=sqlite:///runs.db', 'current', cwd=tmp_path)
    assert f'{MIGRATIONS[-1]} (head)' in current.stdout
    with sqlite3.connect(tmp_path / 'runs.db') as connection:
        tables = {name for (name,) in connection.execute("select name from sqlite_master where type = 'table'")}
    assert {'runs', 'events', 'snapshots', 'tool_effects', 'messages', 'media'} <= tables
    located = _run(
        installed / 'python', '-c', 'import step_persistence; print(step_persistence.__file__)', cwd=tmp_path
    )
    assert str(ROOT) not in located.stdout, 'the test must use the installed wheel, not the checkout'
