"""A real MongoDB-wire server for the tests: SecantusDB (test-only), or any MongoDB named by `MONGODB_URI`.

`mongo_server` starts one SecantusDB server (`secantus_launcher.py`) per test session on 127.0.0.1
with a free port and a storage directory in the session's temporary directory, and waits until it
answers a `ping`.
With `MONGODB_URI` set (e.g. a real mongod 8) the tests use that server instead and start
nothing. Tests isolate themselves with fresh databases (`MongoServer.scratch`), dropped at the end.
"""

from __future__ import annotations

import importlib.util
import inspect
import os
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import pytest
from pymongo import AsyncMongoClient, MongoClient
from pymongo.errors import PyMongoError

from support.servers import free_port, skip_if_opted_out, start_server, stop_server, wait_until

__all__ = ['Driver', 'MongoServer', 'Scratch', 'mongo_server']

Driver = Literal['pymongo', 'motor']


@dataclass
class Scratch:
    """One test's client (of one driver) and the databases it made; see `MongoServer.scratch`."""

    client: Any
    databases: list[str] = field(default_factory=list[str])

    def fresh_database(self) -> str:
        """A new database name, unique to this test (the database is dropped when the test ends)."""
        self.databases.append(f'test_{uuid.uuid4().hex[:16]}')
        return self.databases[-1]


@dataclass(frozen=True)
class MongoServer:
    """Where the session's server listens."""

    uri: str

    def uri_for(self, database: str) -> str:
        """The server's URI with `database` as its path (`mongodb://user@host:port/<database>?options`)."""
        scheme, rest = self.uri.split('://', 1)
        location, _, options = rest.partition('?')
        userinfo, at, hosts = location.rpartition('@')
        return f'{scheme}://{userinfo}{at}{hosts.split("/", 1)[0]}/{database}' + (f'?{options}' if options else '')

    def connect(self, driver: Driver) -> Any:
        """A new async client of `driver` (make it inside the test's event loop, and close it)."""
        if driver == 'motor':
            from motor.motor_asyncio import AsyncIOMotorClient

            return AsyncIOMotorClient(self.uri)
        return AsyncMongoClient(self.uri)

    @asynccontextmanager
    async def scratch(self, driver: Driver = 'pymongo') -> AsyncIterator[Scratch]:
        """A client for one test; on exit its fresh databases are dropped and the client closed."""
        scratch = Scratch(client=self.connect(driver))
        try:
            yield scratch
        finally:
            for name in scratch.databases:
                await scratch.client.drop_database(name)
            closed = scratch.client.close()
            if inspect.isawaitable(closed):
                await closed


def _answers_ping(uri: str) -> bool:
    client: MongoClient[Any] = MongoClient(uri, serverSelectionTimeoutMS=300, connectTimeoutMS=300)
    try:
        client.admin.command('ping')
        return True
    except PyMongoError:
        return False
    finally:
        client.close()


def secantus_command() -> list[str]:
    """The command starting a SecantusDB server (followed by `secantusd-py`'s arguments): see
    `secantus_launcher.py`."""
    if importlib.util.find_spec('secantus') is None:
        raise RuntimeError('SecantusDB is not installed: it is a test dependency (uv sync installs it)')
    return [sys.executable, str(Path(__file__).with_name('secantus_launcher.py'))]


@pytest.fixture(scope='session')
def mongo_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MongoServer]:
    """The session's MongoDB-wire server; tests that need it fail if it cannot start or be reached."""
    skip_if_opted_out('mongo')
    external = os.environ.get('MONGODB_URI')
    if external:
        wait_until(lambda: _answers_ping(external), timeout=30, what=f'MongoDB at MONGODB_URI={external}')
        yield MongoServer(uri=external)
        return
    port = free_port()
    root = tmp_path_factory.mktemp('secantus')
    log_path = root / 'server.log'
    uri = f'mongodb://127.0.0.1:{port}/?directConnection=true'
    command = [
        *secantus_command(),
        *('--host', '127.0.0.1', '--port', str(port), '--storage-path', str(root / 'data')),
        *('--log-level', 'WARNING'),
    ]
    process = start_server(command, log_path=log_path, ready=lambda: _answers_ping(uri), what='SecantusDB', timeout=60)
    try:
        yield MongoServer(uri=uri)
    finally:
        stop_server(process)
