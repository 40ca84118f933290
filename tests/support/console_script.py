"""Running `step-persistence` as a user would: the installed console script, or its entry point in a fork.

`cli` runs a command in a child forked from `cli_zygote.py` (the console script's entry point,
in a fresh process with its own output files and exit status, without importing everything
again); `console_script` runs the installed script itself in a subprocess.
"""

from __future__ import annotations

import atexit
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

__all__ = ['SCRIPT', 'cli', 'console_script']

SCRIPT = Path(sys.executable).with_name('step-persistence')
ZYGOTE = Path(__file__).with_name('cli_zygote.py')


def console_script(*args: str, expect: int = 0) -> subprocess.CompletedProcess[str]:
    """Run the installed `step-persistence ARGS...` in a subprocess and check its exit code."""
    completed = subprocess.run([str(SCRIPT), *args], capture_output=True, text=True, timeout=120)
    assert completed.returncode == expect, (completed.returncode, completed.stdout, completed.stderr)
    return completed


def cli(*args: str, expect: int | None = 0) -> subprocess.CompletedProcess[str]:
    """Run `step-persistence ARGS...` in a child of this test process's zygote and check its exit code
    (any, with `expect=None`)."""
    with tempfile.TemporaryDirectory() as scratch:
        stdout, stderr = Path(scratch, 'stdout'), Path(scratch, 'stderr')
        request = {'args': list(args), 'cwd': os.getcwd(), 'env': dict(os.environ)}
        status = _zygote().run({**request, 'stdout': str(stdout), 'stderr': str(stderr)})
        completed = subprocess.CompletedProcess([str(SCRIPT), *args], status, stdout.read_text(), stderr.read_text())
    assert expect is None or completed.returncode == expect, (completed.returncode, completed.stdout, completed.stderr)
    return completed


class _Zygote:
    def __init__(self) -> None:
        self._process = subprocess.Popen(
            [sys.executable, str(ZYGOTE)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        assert self._read() == 'ready', 'the command-line zygote did not start'

    def _read(self) -> str:
        assert self._process.stdout is not None
        return self._process.stdout.readline().strip()

    def run(self, request: dict[str, object]) -> int:
        """The exit status of the command `request` describes (see `cli_zygote.py`)."""
        assert self._process.stdin is not None
        self._process.stdin.write(json.dumps(request) + '\n')
        self._process.stdin.flush()
        reply = self._read()
        assert reply, 'the command-line zygote ended'
        status: int = json.loads(reply)['status']
        return status

    def close(self) -> None:
        assert self._process.stdin is not None
        self._process.stdin.close()
        self._process.wait(timeout=30)


_running: list[_Zygote] = []


def _zygote() -> _Zygote:
    """This process's zygote, started on first use and stopped when the process exits."""
    if not _running:
        _running.append(_Zygote())
        atexit.register(_running[0].close)
    return _running[0]
