"""The package as a user installs it: the wheel of this tree, built with the uv that runs the tests."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

__all__ = ['ROOT', 'UV', 'build_wheel', 'run']

ROOT = Path(__file__).resolve().parents[2]
UV = [os.environ.get('UV') or shutil.which('uv') or 'uv']
"""The uv that runs the tests (`uv run` names itself in `UV`)."""


def run(*command: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run `command` in `cwd` outside the tests' virtual environment; it must succeed."""
    environment = {**os.environ, 'UV_PYTHON_DOWNLOADS': 'never'}
    environment.pop('VIRTUAL_ENV', None)
    completed = subprocess.run(
        [str(part) for part in command], cwd=cwd, capture_output=True, text=True, timeout=300, env=environment
    )
    assert completed.returncode == 0, (command, completed.stdout, completed.stderr)
    return completed


def build_wheel(scratch: Path) -> Path:
    """The wheel of this tree, built into `scratch/dist`."""
    run(*UV, 'build', '--wheel', '--out-dir', scratch / 'dist', ROOT, cwd=scratch)
    [wheel] = (scratch / 'dist').glob('step_persistence-*.whl')
    return wheel
