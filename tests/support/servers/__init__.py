"""Real servers for the test suite, started by the tests themselves on 127.0.0.1.

Each server is a session-scoped pytest fixture in its own module here. When a server cannot be
started or reached the tests that need it fail. A developer may opt out locally with
`STEP_PERSISTENCE_SKIP_SERVERS=postgres,mongo,s3` (or `all`): those tests are then skipped, with
the reason shown. The opt-out is ignored when `CI` is set, so CI always runs against real servers.
"""

from __future__ import annotations

import os
import random
import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import pytest

__all__ = ['free_port', 'skip_if_opted_out', 'start_server', 'stop_server', 'wait_until']


_SERVER_PORTS = range(20000, 32768)
"""Where servers listen: below Linux's ephemeral range (32768-60999), from which the kernel picks
the local port of every outgoing connection, so no client socket (of this test worker or another)
can take a server's port between choosing it and the server binding it."""


def free_port() -> int:
    """A TCP port on 127.0.0.1, outside the ephemeral range, that was free a moment ago."""
    for port in random.sample(_SERVER_PORTS, 200):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(('127.0.0.1', port))
            except OSError:
                continue
            return port
    raise RuntimeError(f'no free port in {_SERVER_PORTS.start}-{_SERVER_PORTS.stop - 1} on 127.0.0.1')


def skip_if_opted_out(server: str) -> None:
    """Skip the requesting test if the developer opted out of `server` (never under CI)."""
    if os.environ.get('CI'):
        return
    opted_out = {name.strip() for name in os.environ.get('STEP_PERSISTENCE_SKIP_SERVERS', '').split(',')}
    if server in opted_out or 'all' in opted_out:
        pytest.skip(f'{server} server opted out via STEP_PERSISTENCE_SKIP_SERVERS')


def wait_until(check: Callable[[], bool], *, timeout: float, what: str) -> None:
    """Poll `check` until it returns True; raise `TimeoutError` naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(f'{what} did not become ready within {timeout} s')
        time.sleep(0.05)


def start_server(
    command: Sequence[str],
    *,
    log_path: Path,
    ready: Callable[[], bool],
    what: str,
    timeout: float,
    env: Mapping[str, str] | None = None,
) -> subprocess.Popen[bytes]:
    """Start `command` (its output appended to `log_path`) and wait until `ready()`; `RuntimeError` with the
    log if it exits first, `TimeoutError` if it is not ready within `timeout` seconds (it is stopped then)."""
    with log_path.open('ab') as log:
        process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: process.poll() is not None or ready(), timeout=timeout, what=what)
    except TimeoutError:
        stop_server(process)
        raise
    if process.poll() is not None:
        raise RuntimeError(f'{what} exited with status {process.returncode}: {log_path.read_text(errors="replace")}')
    return process


def stop_server(process: subprocess.Popen[bytes], *, timeout: float = 10) -> None:
    """Ask `process` to stop; kill it if it has not within `timeout` seconds."""
    process.terminate()
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
