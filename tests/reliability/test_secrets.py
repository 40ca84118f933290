"""No password of a store URL is ever shown: not in a repr, an exception, a log record or the command line's output.

Each URL below carries a marker password, in the userinfo (raw or percent-encoded, with URL
delimiters in it) or in a query parameter, with the scheme in any case. Every store built from
such a URL is driven through operations that succeed and operations that fail (hostile ids, an
unreachable server, options the driver refuses); everything the library says is collected and
searched for the marker.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from step_persistence import RunRecord, from_spec
from support.console_script import cli
from support.servers.mongo import MongoServer
from support.servers.postgres import PostgresServer

pytestmark = pytest.mark.anyio

MARKER = 'Zq9MarkerSecret'
CLOSED_PORT = 1  # nothing listens there: connecting fails at once


def postgres_urls(server: PostgresServer) -> dict[str, str]:
    base = f'127.0.0.1:{server.port}/postgres'
    return {
        'userinfo': f'postgresql://postgres:{MARKER}@{base}',
        'encoded delimiters': f'postgresql://postgres:{MARKER}%2F%3F%23%40x@{base}',
        'raw delimiters': f'postgresql://postgres:Wr/{MARKER}?x#y@{base}',
        'query parameter': f'postgresql://postgres@{base}?password={MARKER}',
        'upper-case scheme': f'POSTGRESQL://postgres:{MARKER}@{base}',
        'postgres scheme': f'postgres://postgres:{MARKER}@{base}',
        'bad option': f'postgresql://postgres:{MARKER}@{base}?command_timeout=soon',
        'unknown option': f'postgresql://postgres:{MARKER}@{base}?sslmode=require&password={MARKER}',
        'unreachable': f'postgresql://postgres:{MARKER}@127.0.0.1:{CLOSED_PORT}/postgres?timeout=2',
    }


def mongo_urls(server: MongoServer) -> dict[str, str]:
    hosts = server.uri_for('secrets').split('://', 1)[1].rpartition('@')[2].split('/', 1)[0]
    return {
        'userinfo': f'mongodb://admin:{MARKER}@{hosts}/secrets?serverSelectionTimeoutMS=2000',
        'upper-case scheme': f'MONGODB://admin:{MARKER}@{hosts}/secrets?serverSelectionTimeoutMS=2000',
        'raw delimiters': f'mongodb://admin:Wr/{MARKER}?x@{hosts}/secrets',
        'unreachable': f'mongodb://admin:{MARKER}@127.0.0.1:{CLOSED_PORT}/secrets?serverSelectionTimeoutMS=500',
    }


class Said:
    """Everything the library said while a test drove it: exception texts, reprs, log records."""

    def __init__(self, caplog: pytest.LogCaptureFixture) -> None:
        self._caplog = caplog
        self.texts: list[str] = []

    def add(self, value: object) -> None:
        self.texts.append(f'{value!s} {value!r}')
        if isinstance(value, BaseException):
            cause: BaseException | None = value.__cause__ or value.__context__
            while cause is not None:
                self.texts.append(f'{cause!s} {cause!r}')
                cause = cause.__cause__ or cause.__context__

    async def attempt(self, action: Callable[[], Awaitable[Any]]) -> None:
        try:
            self.add(await action())
        except Exception as error:
            self.add(error)

    def leaks(self) -> list[str]:
        said = [*self.texts, *(record.getMessage() for record in self._caplog.records)]
        said += [repr(record.args) for record in self._caplog.records]
        return [text for text in said if MARKER in text]


async def drive(url: str, said: Said) -> None:
    """Open a store from `url` and use it as a caller would, including hostile calls."""
    try:
        store = from_spec(url)
    except Exception as error:
        said.add(error)
        return
    said.add(store)
    try:
        await said.attempt(lambda: store.register_run(RunRecord(run_id='secret-run')))
        await said.attempt(lambda: store.register_run(RunRecord(run_id='secret-run')))  # a duplicate
        await said.attempt(lambda: store.list_runs())
        await said.attempt(lambda: store.get_run(run_id={'$ne': None}))  # type: ignore[arg-type]
        await said.attempt(lambda: store.list_events(run_id='no-such-run'))
        await said.attempt(lambda: store.delete_run(run_id='secret-run'))
    finally:
        await said.attempt(store.aclose)


@pytest.fixture
def said(caplog: pytest.LogCaptureFixture) -> Said:
    caplog.set_level(logging.DEBUG)
    return Said(caplog)


@pytest.mark.parametrize('case', list(postgres_urls(PostgresServer(port=0))))
async def test_postgres_urls_never_show_their_password(case: str, postgres_server: PostgresServer, said: Said) -> None:
    await drive(postgres_urls(postgres_server)[case], said)
    assert said.leaks() == []


@pytest.mark.parametrize('case', list(mongo_urls(MongoServer(uri='mongodb://127.0.0.1:0'))))
async def test_mongo_urls_never_show_their_password(case: str, mongo_server: MongoServer, said: Said) -> None:
    await drive(mongo_urls(mongo_server)[case], said)
    assert said.leaks() == []


def test_the_command_line_never_shows_a_password(postgres_server: PostgresServer, mongo_server: MongoServer) -> None:
    urls = [*postgres_urls(postgres_server).values(), *mongo_urls(mongo_server).values()]
    leaked = []
    for url in urls:
        for command in (['runs', 'list'], ['db', 'current']):
            completed = cli(*command, '--store', url, expect=None)
            if MARKER in completed.stdout + completed.stderr:
                leaked.append((url, command, completed.stdout + completed.stderr))
    assert leaked == []
