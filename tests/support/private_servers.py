"""Servers of the fault tests' own, which they stop and restart (on the same port and data directory).

Built from the same pieces as the session-wide servers in `tests/support/servers`, so they fail (never
skip) the same way when they cannot start, and honour the same local opt-out.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
from functools import partial
from pathlib import Path

from support.servers import free_port, start_server, stop_server
from support.servers.mongo import _answers_ping, secantus_command
from support.servers.postgres import (
    SERVER_OPTIONS,
    PostgresServer,
    _as_server_user,
    _binaries,
    _memory_backed_directory,
)


def children_of(parent: int) -> list[int]:
    """Every process whose parent is `parent` (from /proc)."""
    children = []
    for entry in Path('/proc').iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / 'stat').read_text()
        except OSError:
            continue
        if int(stat.rsplit(')', 1)[1].split()[1]) == parent:
            children.append(int(entry.name))
    return children


class PrivatePostgres:
    """A throwaway cluster that a test may stop and start again."""

    def __init__(self) -> None:
        self._bin = _binaries()
        self.root = Path(tempfile.mkdtemp(prefix='step-persistence-faults-pg-', dir=_memory_backed_directory()))
        if os.geteuid() == 0:
            shutil.chown(self.root, user='postgres', group='postgres')
        self.data = self.root / 'data'
        self.server = PostgresServer(port=free_port())
        self._run(
            'initdb',
            *('-D', str(self.data), '-U', 'postgres', '--auth-local=trust', '--auth-host=trust'),
            *('-E', 'UTF8', '--no-sync'),
        )
        self.start()

    def _run(self, tool: str, *arguments: str) -> None:
        command = _as_server_user([str(self._bin / tool), *arguments])
        completed = subprocess.run(command, cwd='/', capture_output=True, text=True, timeout=120)
        if completed.returncode != 0:
            log = self.root / 'server.log'
            raise RuntimeError(
                f'{tool} failed ({completed.returncode}): {completed.stderr}'
                + (log.read_text() if log.exists() else '')
            )

    def start(self) -> None:
        options = f'-p {self.server.port} -c unix_socket_directories={self.root} {SERVER_OPTIONS}'
        self._run('pg_ctl', '-D', str(self.data), '-l', str(self.root / 'server.log'), '-o', options, '-w', 'start')

    def stop(self) -> None:
        self._run('pg_ctl', '-D', str(self.data), '-m', 'fast', '-w', 'stop')

    def _processes(self) -> list[int]:
        """The postmaster and every process it started."""
        postmaster = int((self.data / 'postmaster.pid').read_text().split()[0])
        return [postmaster, *children_of(postmaster)]

    def freeze(self) -> None:
        """Suspend the server: connections stay open and new ones are accepted by the kernel, nothing answers."""
        for pid in self._processes():
            os.kill(pid, signal.SIGSTOP)

    def thaw(self) -> None:
        for pid in self._processes():
            os.kill(pid, signal.SIGCONT)

    def close(self) -> None:
        try:
            if (self.data / 'postmaster.pid').exists():
                self.thaw()
                self.stop()
        finally:
            shutil.rmtree(self.root, ignore_errors=True)


class PrivateMongo:
    """A SecantusDB server on a fixed port and storage directory that a test may stop and start again."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.port = free_port()
        self.uri = f'mongodb://127.0.0.1:{self.port}/?directConnection=true'
        self._process: subprocess.Popen[bytes] | None = None
        self.start()

    def start(self) -> None:
        command = [
            *secantus_command(),
            *('--host', '127.0.0.1', '--port', str(self.port), '--storage-path', str(self.root / 'data')),
            *('--log-level', 'WARNING'),
        ]
        ready = partial(_answers_ping, self.uri)
        self._process = start_server(
            command, log_path=self.root / 'server.log', ready=ready, what='SecantusDB', timeout=60
        )

    def freeze(self) -> None:
        assert self._process is not None
        for pid in [self._process.pid, *children_of(self._process.pid)]:
            os.kill(pid, signal.SIGSTOP)

    def thaw(self) -> None:
        assert self._process is not None
        for pid in [self._process.pid, *children_of(self._process.pid)]:
            os.kill(pid, signal.SIGCONT)

    def stop(self) -> None:
        if self._process is not None:
            self.thaw()
        process, self._process = self._process, None
        if process is not None:
            stop_server(process, timeout=30)

    def close(self) -> None:
        """Kill the server: its data is thrown away, no need to wait for a clean shutdown."""
        process, self._process = self._process, None
        if process is not None:
            process.kill()
            process.wait()
