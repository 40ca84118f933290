"""A throwaway PostgreSQL cluster for the test session (Debian's `postgresql` binaries).

`make test` installs the binaries when they are missing; this fixture only starts a cluster:
`initdb` into a temporary directory, `pg_ctl start` on 127.0.0.1 and a free port (as the
`postgres` OS user when running as root, since PostgreSQL refuses to run as root), and
`pg_ctl stop` plus removal of the directory at the end. Tests get fresh databases from it.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from support.servers import free_port, skip_if_opted_out

__all__ = ['PostgresServer', 'postgres_server']

SERVER_OPTIONS = (
    '-c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=200 '
    "-c listen_addresses='127.0.0.1'"
)


@dataclass(frozen=True)
class PostgresServer:
    """A running cluster; `postgres` is a trusted superuser on 127.0.0.1:`port`."""

    port: int

    def url(self, database: str = 'postgres') -> str:
        return f'postgresql+asyncpg://postgres@127.0.0.1:{self.port}/{database}'

    async def create_database(self, *, template: str | None = None) -> str:
        """A new, uniquely named database (a copy of `template` if given); returns its name."""
        name = f'test_{uuid.uuid4().hex[:12]}'
        await self.admin(f'CREATE DATABASE {name}' + (f' TEMPLATE {template}' if template else ''))
        return name

    async def drop_database(self, name: str) -> None:
        await self.admin(f'DROP DATABASE IF EXISTS {name} WITH (FORCE)')

    async def admin(self, sql: str) -> None:
        """Run one statement outside a transaction on the maintenance database."""
        import asyncpg

        connection = await asyncpg.connect(host='127.0.0.1', port=self.port, user='postgres', database='postgres')
        try:
            await connection.execute(sql)
        finally:
            await connection.close()


def _binaries() -> Path:
    found = sorted(glob.glob('/usr/lib/postgresql/*/bin/initdb'), key=lambda path: int(Path(path).parts[-3]))
    if not found:
        raise RuntimeError(
            'PostgreSQL binaries not found under /usr/lib/postgresql/*/bin: run `make test`, which installs them'
        )
    return Path(found[-1]).parent


def _memory_backed_directory() -> str | None:
    """`/dev/shm` when usable: a throwaway cluster on tmpfs creates databases several times faster."""
    shm = Path('/dev/shm')
    return str(shm) if shm.is_dir() and os.access(shm, os.W_OK | os.X_OK) else None


def _as_server_user(command: list[str]) -> list[str]:
    return ['runuser', '-u', 'postgres', '--', *command] if os.geteuid() == 0 else command


_START_ATTEMPTS = 5


@pytest.fixture(scope='session')
def postgres_server() -> Iterator[PostgresServer]:
    """Start a cluster once per session; tests that need PostgreSQL fail if it cannot start."""
    skip_if_opted_out('postgres')
    bin_dir = _binaries()
    root = Path(tempfile.mkdtemp(prefix='step-persistence-pg-', dir=_memory_backed_directory()))
    if os.geteuid() == 0:
        shutil.chown(root, user='postgres', group='postgres')
    data = root / 'data'
    port = free_port()

    def run(*command: str) -> None:
        completed = subprocess.run(_as_server_user(list(command)), cwd='/', capture_output=True, text=True, timeout=120)
        if completed.returncode != 0:
            log = root / 'server.log'
            raise RuntimeError(
                f'{command[0]} failed ({completed.returncode}): {completed.stderr}'
                + (log.read_text() if log.exists() else '')
            )

    try:
        run(
            str(bin_dir / 'initdb'),
            '-D',
            str(data),
            '-U',
            'postgres',
            '--auth-local=trust',
            '--auth-host=trust',
            '-E',
            'UTF8',
            '--no-sync',
        )
        for attempt in range(_START_ATTEMPTS):
            options = f'-p {port} -c unix_socket_directories={root} {SERVER_OPTIONS}'
            log = root / 'server.log'
            log.unlink(missing_ok=True)
            try:
                run(str(bin_dir / 'pg_ctl'), '-D', str(data), '-l', str(log), '-o', options, '-w', 'start')
                break
            except RuntimeError as error:
                if 'Address already in use' not in str(error) or attempt == _START_ATTEMPTS - 1:
                    raise
                port = free_port()  # taken between choosing it and binding it: choose again
        try:
            yield PostgresServer(port=port)
        finally:
            run(str(bin_dir / 'pg_ctl'), '-D', str(data), '-m', 'fast', '-w', 'stop')
    finally:
        shutil.rmtree(root, ignore_errors=True)
