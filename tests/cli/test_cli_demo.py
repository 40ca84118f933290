"""`make demo` and the demo itself (issue 18, item 10): keeps what `make test` installed, shows pydantic-ai's
banner at most once, and prints no Python reprs."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from support.console_script import SCRIPT

ROOT = Path(__file__).resolve().parents[2]
BANNER = 'PYDANTIC_AI_NO_BANNER=1'
"""The last line of pydantic-ai's first-run banner."""


def make_demo_commands() -> list[str]:
    completed = subprocess.run(
        ['make', '--no-print-directory', '-n', 'demo'], cwd=ROOT, capture_output=True, text=True, check=True, timeout=60
    )
    return [line.strip() for line in completed.stdout.splitlines() if ' uv ' in f' {line} ']


def test_make_demo_removes_nothing_installed() -> None:
    commands = make_demo_commands()
    syncs = [command for command in commands if re.search(r'\buv sync\b', command)]
    assert syncs, commands
    uv = os.environ.get('UV') or shutil.which('uv')  # `uv run` names itself in UV
    if uv is None:
        pytest.skip('needs uv, as make demo does')
    for command in syncs:
        words = shlex.split(command)
        dry_run = [uv, *(word for word in words[words.index('uv') + 1 :] if word != '--quiet'), '--dry-run']
        completed = subprocess.run(
            dry_run,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, 'UV_PYTHON_DOWNLOADS': 'never'},
            check=True,
        )
        assert 'uninstall' not in (completed.stdout + completed.stderr).lower(), (command, completed.stderr)
    runs = [command for command in commands if re.search(r'\buv run\b', command)]
    assert runs and all('--exact' not in command for command in runs), runs


def test_the_demo_shows_the_banner_at_most_once_and_no_reprs(tmp_path: Path) -> None:
    # As a person (or a coding agent) would run it: not under pytest, not in CI.
    quiet = ('PYTEST_VERSION', 'PYTEST_CURRENT_TEST', 'CI', 'PYDANTIC_AI_NO_BANNER', 'STEP_PERSISTENCE_STORE')
    environment = {key: value for key, value in os.environ.items() if key not in quiet}
    completed = subprocess.run(
        [str(SCRIPT), 'demo', '--store', f'sqlite:///{tmp_path / "demo.db"}'],
        capture_output=True,
        text=True,
        timeout=300,
        env={**environment, 'AI_AGENT': 'step-persistence-tests'},
        check=True,
    )
    printed = completed.stdout + completed.stderr
    assert (completed.stdout + completed.stderr).count(BANNER) <= 1, printed
    assert 'Continued run answered' in completed.stdout
    assert "idempotency key 'report::report.md', summary 'write report.md'" in completed.stdout
    assert 'None' not in completed.stdout, completed.stdout
