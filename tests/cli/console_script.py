"""Running the installed `step-persistence` console script in a subprocess, as a user would."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

__all__ = ['SCRIPT', 'cli']

SCRIPT = Path(sys.executable).with_name('step-persistence')


def cli(*args: str, expect: int = 0) -> subprocess.CompletedProcess[str]:
    """Run `step-persistence ARGS...` and check its exit code."""
    completed = subprocess.run([str(SCRIPT), *args], capture_output=True, text=True, timeout=120)
    assert completed.returncode == expect, (completed.returncode, completed.stdout, completed.stderr)
    return completed
