"""Running `step-persistence` as a user would: the console script's entry point in a forked process.

`cli` runs a command in a child forked from `cli_zygote.py` (the console script's entry point,
in a fresh process with its own output files, terminal if asked, environment and exit status,
without importing everything again); `python_script` runs a test script (another process writing
to a store, crashing in it) the same way. `SCRIPT` is the installed script itself, for the tests
whose point is a new interpreter (its imports, its first-run output) or a long-lived server process.
"""

from __future__ import annotations

import atexit
import json
import os
import subprocess
import sys
import tempfile
import threading
from collections.abc import Mapping
from pathlib import Path

__all__ = ['SCRIPT', 'cli', 'python_script']

SCRIPT = Path(sys.executable).with_name('step-persistence')
ZYGOTE = Path(__file__).with_name('cli_zygote.py')


def cli(
    *args: str,
    expect: int | None = 0,
    env: Mapping[str, str] | None = None,
    stdout: str | None = None,
    stderr: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run `step-persistence ARGS...` in a child of this test process's zygote and check its exit code
    (any, with `expect=None`).

    The child gets `env` (default: this process's environment) and writes its output to the files
    `stdout` and `stderr` name (a terminal's device, `os.devnull`) if given, else to files read into
    the result."""
    completed = _forked([str(SCRIPT), *args], {'args': list(args)}, env=env, stdout=stdout, stderr=stderr)
    assert expect is None or completed.returncode == expect, (completed.returncode, completed.stdout, completed.stderr)
    return completed


def python_script(script: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Run `python SCRIPT ARGS...` in a child of this test process's zygote (a process of its own, with
    pydantic-ai and the package already imported), its output captured."""
    return _forked([sys.executable, str(script), *args], {'script': str(script), 'args': list(args)})


def _forked(
    argv: list[str],
    request: dict[str, object],
    env: Mapping[str, str] | None = None,
    stdout: str | None = None,
    stderr: str | None = None,
) -> subprocess.CompletedProcess[str]:
    with tempfile.TemporaryDirectory() as scratch:
        captured = {'stdout': Path(scratch, 'stdout'), 'stderr': Path(scratch, 'stderr')}
        targets = {'stdout': stdout or str(captured['stdout']), 'stderr': stderr or str(captured['stderr'])}
        where = {'cwd': os.getcwd(), 'env': dict(os.environ if env is None else env)}
        status = _zygote().run({**request, **where, **targets})
        output = {name: path.read_text() if path.exists() else '' for name, path in captured.items()}
    return subprocess.CompletedProcess(argv, status, output['stdout'], output['stderr'])


class _Zygote:
    def __init__(self) -> None:
        self._process = subprocess.Popen(
            [sys.executable, str(ZYGOTE)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        assert self._read() == 'ready', 'the command-line zygote did not start'
        self._lock = threading.Lock()

    def _read(self) -> str:
        assert self._process.stdout is not None
        return self._process.stdout.readline().strip()

    def run(self, request: dict[str, object]) -> int:
        """The exit status of the command `request` describes (see `cli_zygote.py`)."""
        assert self._process.stdin is not None
        with self._lock:  # one request at a time, from any thread
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
