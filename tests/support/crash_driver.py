"""The test's side of `crash_zygote.py`: start it once, run children, kill them at a chosen message."""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

ZYGOTE = Path(__file__).with_name('crash_zygote.py')
MESSAGE_TIMEOUT = 60.0
"""Seconds to wait for any one message before failing (a child that hangs fails the test)."""


@dataclass
class ChildRun:
    """What one child did: its messages up to the kill, whether it was killed, its exit status."""

    messages: list[dict[str, Any]] = field(default_factory=list[dict[str, Any]])
    killed_at: dict[str, Any] | None = None
    status: int | None = None


class Zygote:
    """A running `crash_zygote.py`; `run(command, kill_at)` forks one child and drives it."""

    def __init__(self, log: Path) -> None:
        self.log_path = log
        self._log = log.open('wb')
        self._process = subprocess.Popen(
            [sys.executable, str(ZYGOTE)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log, bufsize=0
        )
        assert self._process.stdin is not None and self._process.stdout is not None
        self._stdin: IO[bytes] = self._process.stdin
        self._stdout: IO[bytes] = self._process.stdout
        self._buffer = b''
        ready = self._read()
        assert ready == {'op': 'ready'}, ready

    def log_tail(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors='replace')[-20000:]

    def _read(self) -> dict[str, Any]:
        deadline = time.monotonic() + MESSAGE_TIMEOUT
        while b'\n' not in self._buffer:
            remaining = deadline - time.monotonic()
            readable, _, _ = select.select([self._stdout], [], [], max(remaining, 0))
            if not readable:
                raise TimeoutError(f'no message from the crash child within {MESSAGE_TIMEOUT} s:\n{self.log_tail()}')
            chunk = os.read(self._stdout.fileno(), 65536)
            if not chunk:
                raise EOFError(f'the zygote exited ({self._process.poll()}):\n{self.log_tail()}')
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b'\n', 1)
        message: dict[str, Any] = json.loads(line)
        return message

    def _send(self, line: str) -> None:
        self._stdin.write(line.encode() + b'\n')

    def run(
        self, command: dict[str, Any], *, kill_at: int | None, on_message: Callable[[dict[str, Any]], None]
    ) -> ChildRun:
        """Run one child; SIGKILL it at its `kill_at`-th message (counting from 1, after `hello`).

        The child stops at that message until told `go`; it is killed there instead. Every message
        is passed to `on_message`, in order, the killing one included.
        """
        self._send(json.dumps({**command, 'kill_at': kill_at}))
        hello = self._read()
        assert hello['op'] == 'hello', f'{hello}\n{self.log_tail()}'
        pid = hello['pid']
        child = ChildRun()
        try:
            while True:
                message = self._read()
                if message['op'] == 'exit':
                    child.status = message['status']
                    return child
                assert child.killed_at is None, f'the child went on after it was killed: {message}'
                child.messages.append(message)
                on_message(message)
                if len(child.messages) == kill_at:
                    os.kill(pid, signal.SIGKILL)
                    child.killed_at = message
        except BaseException:
            self._abandon(pid)
            raise

    def _abandon(self, pid: int) -> None:
        """After a failure: kill the child and read up to the zygote's `exit`, so the next run starts clean."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(Exception):
            while self._read()['op'] != 'exit':
                pass

    def write_concurrently(self, jobs: list[dict[str, Any]]) -> list[int]:
        """Fork one writer per job (see `crash_zygote.WRITERS`), start them together; their exit codes."""
        self._send(json.dumps({'writers': jobs}))
        message = self._read()
        assert message['op'] == 'exit', message
        statuses: list[int] = message['statuses']
        return statuses

    def close(self) -> None:
        self._stdin.close()
        try:
            self._process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        self._log.close()
