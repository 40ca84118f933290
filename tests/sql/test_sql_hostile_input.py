"""Hostile input to the SQL stores (issue 16): secrets in URLs, URL options asyncpg does not take, long ids,
ids that are not strings.

- No password (in the userinfo, whatever characters it holds, or as `?password=` / `?sslpassword=`, in
  a URL of any case) shows in a store's repr, in the `ValueError` of a URL the store refuses, or in the
  error of a connection that fails: message and traceback alike.
- libpq's common URL options are translated for asyncpg (`sslmode`, `sslrootcert`..., `connect_timeout`,
  `application_name`); any other is a `ValueError` naming it when the store is built, and on the
  command line a usage error (exit 2), instead of asyncpg's `TypeError` at the first connection.
- An id or key the store indexes longer than `MAX_INDEXED_BYTES` in UTF-8 is a `ValueError` with
  nothing written, on both dialects (PostgreSQL's btree refuses an entry over 2704 bytes of random
  text); text the store does not index has no such limit. So is a step index beyond 32 bits (the
  width of PostgreSQL's `INTEGER`).
- The media store refuses a URI that is not a string with `TypeError`, like the step store's ids
  (the step store's own check is in the conformance suite).
"""

from __future__ import annotations

import random
import socket
import traceback
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from sqlalchemy import text

from step_persistence import (
    ContinuableSnapshot,
    PostgresStepStore,
    RunRecord,
    SqlStepStore,
    StepEvent,
    ToolEffectRecord,
    from_spec,
)
from step_persistence.media import PostgresMediaStore, SqlMediaStore, StoredBlob, media_uri_for
from step_persistence.records import RunOrigin, StepWrites
from step_persistence.testing.conformance import T0, sample_history
from support.console_script import cli
from support.databases import EmptyDatabase

pytestmark = pytest.mark.anyio

SECRET = 'Sesame8Secret'

PASSWORDS = [SECRET, f'Wr/{SECRET}', f'Wr?{SECRET}', f'Wr#{SECRET}', f'Wr@{SECRET}', f'Wr:{SECRET}']
"""Passwords holding the characters that end a URL's authority (or its userinfo) early."""


def leaked(error: BaseException) -> bool:
    """Whether the secret shows anywhere in the error's traceback (its causes included)."""
    shown = ''.join(traceback.format_exception(error))
    return SECRET in shown or SECRET[:6] in shown


def refused(build: Callable[[], object]) -> ValueError:
    with pytest.raises(ValueError) as raised:  # noqa: PT011 (the callers check the message)
        build()
    return raised.value


# --- item 1: secrets ---

SECRET_URLS = [
    *(f'postgresql://app:{password}@db.example/runs' for password in PASSWORDS),
    f'postgresql://app@db.example/runs?password={SECRET}',
    f'postgresql://app@db.example/runs?sslpassword={SECRET}&sslmode=require',
    f'POSTGRESQL://app:{SECRET}@db.example/runs',
    f'PostgreSQL+AsyncPG://app:{SECRET}@db.example/runs',
]
REFUSED_URLS = [*SECRET_URLS, f'postgresql://app@db.example/runs?PASSWORD={SECRET}']


@pytest.mark.parametrize('url', SECRET_URLS)
async def test_no_password_shows_in_a_stores_repr(url: str) -> None:
    for build in (PostgresStepStore, SqlStepStore, from_spec, PostgresMediaStore, SqlMediaStore):
        store: Any = build(url)
        try:
            shown = repr(store)
            assert SECRET not in shown and SECRET[:6] not in shown, shown
            assert 'postgresql+asyncpg://' in shown, 'the scheme is read in any case'
        finally:
            await store.aclose()


@pytest.mark.parametrize('url', REFUSED_URLS)
@pytest.mark.parametrize(
    'bad', ['command_timeout=x', 'timeout=0', 'connect_timeout=-1', 'sslmode=sometimes', 'bogus=1', 'options=-c%20x']
)
def test_no_password_shows_in_the_error_of_a_url_the_store_refuses(url: str, bad: str) -> None:
    refused_url = f'{url}{"&" if "?" in url.rpartition("@")[2] else "?"}{bad}'
    for build in (PostgresStepStore, SqlStepStore, from_spec, PostgresMediaStore):
        error = refused(lambda: build(refused_url))  # noqa: B023
        assert not leaked(error), error


@pytest.mark.parametrize('password', PASSWORDS)
async def test_no_password_shows_in_the_error_of_a_connection_that_fails(password: str) -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(('127.0.0.1', 0))
        port = probe.getsockname()[1]
    for url in (
        f'postgresql://app:{password}@127.0.0.1:{port}/runs?timeout=2',
        f'postgresql://app@127.0.0.1:{port}/runs?timeout=2&password={password}&sslpassword={password}',
    ):
        async with PostgresStepStore(url) as store:
            with pytest.raises(Exception) as raised:  # noqa: PT011 (whatever the driver raises)
                await store.list_runs()
        assert not leaked(raised.value), raised.value


# --- item 11: URL options ---


@pytest.mark.parametrize(
    ('query', 'named'),
    [
        ('sslmdoe=require', "'sslmdoe'"),
        ('options=-c%20search_path%3Dx', "'options'"),
        ('keepalives=1&application_name=a', "'keepalives'"),
        ('schema=steps', 'pass the schema as schema='),
        ('sslmode=sometimes', 'sslmode must be one of disable, allow, prefer, require, verify-ca, verify-full'),
        ('ssl=yes', 'ssl must be one of'),
        ('sslmode=require&ssl=require', 'sslmode or ssl, not both'),
        ('sslmode=require&sslmode=disable', 'sslmode is given 2 times'),
        ('ssl_min_protocol_version=SSLv3', 'ssl_min_protocol_version must be one of'),
        ('target_session_attrs=mostly', 'target_session_attrs must be one of'),
        ('statement_cache_size=none', 'statement_cache_size must be a whole number'),
        ('prepared_statement_cache_size=-1', 'prepared_statement_cache_size must be a whole number'),
    ],
)
def test_an_option_asyncpg_does_not_take_is_refused_by_name(query: str, named: str) -> None:
    url = f'postgresql://app:{SECRET}@db.example/runs?{query}'
    builders: list[Callable[[str], object]] = [PostgresStepStore, PostgresMediaStore]
    if not query.startswith('schema='):  # from_spec takes ?schema= itself
        builders.append(from_spec)
    for build in builders:
        error = refused(lambda: build(url))  # noqa: B023
        assert named in str(error) and not leaked(error), error


def test_libpq_options_become_asyncpgs_arguments() -> None:
    from sqlalchemy.engine import make_url

    from step_persistence.stores.sql.engines import asyncpg_arguments

    url = make_url(
        'postgresql+asyncpg://app@db.example/runs?sslmode=verify-full&sslrootcert=/etc/ca.pem&sslpassword=k%26y'
        '&connect_timeout=5&application_name=billing&target_session_attrs=read-write&statement_cache_size=0'
        '&prepared_statement_cache_size=0&host=db2.example'
    )
    driver_url, arguments = asyncpg_arguments(url)
    assert dict(driver_url.query) == {'host': 'db2.example'}, 'what asyncpg takes as it is stays in the URL'
    assert arguments == {
        'timeout': 5.0,
        'dsn': 'postgresql://?sslmode=verify-full&sslrootcert=%2Fetc%2Fca.pem&sslpassword=k%26y',
        'server_settings': {'application_name': 'billing'},
        'target_session_attrs': 'read-write',
        'statement_cache_size': 0,
        'prepared_statement_cache_size': 0,
    }


async def test_libpq_options_work_on_the_real_server(postgres_database: EmptyDatabase) -> None:
    options = (
        'sslmode=disable&application_name=steps-probe&connect_timeout=5&statement_cache_size=0'
        '&prepared_statement_cache_size=0&target_session_attrs=any'
    )
    async with PostgresStepStore(f'{postgres_database.url}?{options}') as store:
        await store.register_run(RunRecord(run_id='r'))
        assert [run.run_id for run in await store.list_runs()] == ['r']
        database = await store.ready_database()
        shown = await database.run(
            lambda transaction: transaction.connection.execute(text('SHOW application_name')).scalar(), write=False
        )
        assert shown == 'steps-probe'
    async with PostgresStepStore(f'{postgres_database.url}?sslmode=prefer') as store:
        assert [run.run_id for run in await store.list_runs()] == ['r']


async def test_sslmode_require_reaches_asyncpg(postgres_database: EmptyDatabase) -> None:
    """The test server has no TLS: with `sslmode=require` asyncpg refuses to connect (not a `TypeError`)."""
    async with PostgresStepStore(f'{postgres_database.url}?sslmode=require&timeout=5') as store:
        with pytest.raises(Exception) as raised:  # noqa: PT011 (whatever asyncpg raises)
            await store.list_runs()
    assert not isinstance(raised.value, TypeError), raised.value
    assert 'SSL' in str(raised.value), raised.value


@pytest.mark.parametrize(('query', 'named'), [('sslmode=sometimes', 'sslmode'), ('sslmdoe=require', 'sslmdoe')])
def test_the_command_line_calls_a_bad_option_a_usage_error(query: str, named: str) -> None:
    with socket.socket() as probe:
        probe.bind(('127.0.0.1', 0))
        port = probe.getsockname()[1]
    completed = cli('runs', 'list', '--store', f'postgresql://app:{SECRET}@127.0.0.1:{port}/runs?{query}', expect=2)
    assert named in completed.stderr and 'Traceback' not in completed.stderr, completed.stderr
    assert SECRET not in completed.stdout + completed.stderr


# --- item 7: long ids ---

MAX_INDEXED_BYTES = 1024
"""The documented limit (`stores.sql.rows.MAX_INDEXED_BYTES`)."""


def test_the_documented_limit_is_the_stores() -> None:
    from step_persistence.stores.sql import rows

    assert rows.MAX_INDEXED_BYTES == MAX_INDEXED_BYTES


def incompressible(length: int, *, seed: int = 16) -> str:
    """Random characters from a wide alphabet (PostgreSQL compresses `'y' * 5000` under its limit)."""
    generator = random.Random(seed)
    return ''.join(
        chr(generator.choice([generator.randrange(0x21, 0x7F), generator.randrange(0xA1, 0x2FFF)]))
        for _ in range(length)
    )


def of_bytes(size: int) -> str:
    """Random text of exactly `size` UTF-8 bytes."""
    value = ''
    seed = 0
    while len(value.encode()) < size - 3:
        value += incompressible(1, seed=seed)
        seed += 1
    return value + 'x' * (size - len(value.encode()))


def long_writes(value: str) -> dict[str, Callable[[SqlStepStore], Awaitable[object]]]:
    """Every write with `value` as one indexed id or key."""
    return {
        'run_id': lambda store: store.register_run(RunRecord(run_id=value)),
        'conversation_id': lambda store: store.register_run(RunRecord(run_id='new', conversation_id=value)),
        'parent_run_id': lambda store: store.register_run(RunRecord(run_id='new', parent_run_id=value)),
        'agent_name': lambda store: store.register_run(RunRecord(run_id='new', agent_name=value)),
        'origin run_id': lambda store: store.register_run(
            RunRecord(run_id='new', origin=RunOrigin(kind='continued', run_id=value, seq=1))
        ),
        'event idempotency_key': lambda store: store.append_event(
            StepEvent(run_id='r', kind='run_started', step_index=0, idempotency_key=value)
        ),
        'snapshot idempotency_key': lambda store: store.save_snapshot(
            ContinuableSnapshot(run_id='r', step_index=1, messages=sample_history(1), idempotency_key=value)
        ),
        'tool_call_id': lambda store: store.record_tool_effect(
            ToolEffectRecord(run_id='r', tool_call_id=value, tool_name='t', status='started')
        ),
        'tool_call_id in a batch': lambda store: store.write_batch(
            StepWrites(
                events=[StepEvent(run_id='r', kind='run_completed', step_index=9)],
                tool_effects=[ToolEffectRecord(run_id='r', tool_call_id=value, tool_name='t', status='started')],
            )
        ),
    }


async def everything(store: SqlStepStore) -> tuple[object, ...]:
    return (
        await store.list_runs(),
        await store.list_events(run_id='r'),
        await store.list_snapshots(run_id='r', include_interrupted=True),
        await store.list_tool_effects(run_id='r'),
    )


@pytest.mark.parametrize('size', [5000, MAX_INDEXED_BYTES + 1])
async def test_an_indexed_id_too_long_is_refused_with_nothing_written(empty_database: EmptyDatabase, size: int) -> None:
    value = incompressible(size) if size == 5000 else of_bytes(size)
    assert len(value.encode()) >= size
    async with SqlStepStore(empty_database.url) as store:
        await store.register_run(RunRecord(run_id='r', started_at=T0))
        before = await everything(store)
        for name, write in long_writes(value).items():
            with pytest.raises(ValueError, match=f'at most {MAX_INDEXED_BYTES}') as raised:
                await write(store)
            assert 'bytes long in UTF-8' in str(raised.value), name
            assert await everything(store) == before, f'{name}: something was written'


async def test_ids_up_to_the_limit_and_long_unindexed_text_round_trip(empty_database: EmptyDatabase) -> None:
    at_limit = of_bytes(MAX_INDEXED_BYTES)
    long_text = incompressible(5000)
    async with SqlStepStore(empty_database.url) as store:
        origin = RunOrigin(kind='forked', run_id=at_limit, seq=1)
        await store.register_run(
            RunRecord(
                run_id=at_limit,
                conversation_id=at_limit,
                parent_run_id=at_limit,
                agent_name=at_limit,
                origin=origin,
                metadata={'note': long_text},
            )
        )
        await store.append_event(
            StepEvent(run_id=at_limit, kind='run_failed', step_index=0, idempotency_key=at_limit, error=long_text)
        )
        await store.record_tool_effect(
            ToolEffectRecord(run_id=at_limit, tool_call_id=at_limit, tool_name=long_text, status='started')
        )
        [run] = await store.list_runs(conversation_id=at_limit, agent_name=at_limit, origin_run_id=at_limit)
        assert (run.run_id, run.parent_run_id, run.agent_name) == (at_limit, at_limit, at_limit)
        assert (run.origin, run.metadata) == (origin, {'note': long_text})
        [event] = await store.list_events(run_id=at_limit)
        assert (event.idempotency_key, event.error) == (at_limit, long_text)
        effect = await store.get_tool_effect(run_id=at_limit, tool_call_id=at_limit)
        assert effect is not None and effect.tool_name == long_text


@pytest.mark.parametrize('step_index', [2**31, -(2**31) - 1, 2**40])
async def test_a_step_index_beyond_32_bits_is_refused_with_nothing_written(
    empty_database: EmptyDatabase, step_index: int
) -> None:
    async with SqlStepStore(empty_database.url) as store:
        await store.register_run(RunRecord(run_id='r', started_at=T0))
        before = await everything(store)
        for write in (
            lambda: store.append_event(StepEvent(run_id='r', kind='run_started', step_index=step_index)),
            lambda: store.save_snapshot(ContinuableSnapshot(run_id='r', step_index=step_index, messages=[])),
        ):
            with pytest.raises(ValueError, match=r'step_index -?\d+ is outside the range the SQL store keeps'):
                await write()
            assert await everything(store) == before
        await store.append_event(StepEvent(run_id='r', kind='run_started', step_index=2**31 - 1))
        [event] = await store.list_events(run_id='r')
        assert event.step_index == 2**31 - 1


# --- item 8: the media store's URIs ---


async def test_the_media_store_refuses_a_uri_that_is_not_a_string(empty_database: EmptyDatabase) -> None:
    async with SqlMediaStore(empty_database.url) as media:
        uri = await media.put(b'payload')
        for value in ({'$ne': None}, 5, [uri], uri.encode()):
            for call in (media.get, media.exists, media.touch, media.get_metadata, media.public_url):
                with pytest.raises(TypeError, match='uri must be a string'):
                    await call(value)  # type: ignore[arg-type]
            with pytest.raises(TypeError, match='must be a string'):
                await media.delete_blob(StoredBlob(uri, value, T0))  # type: ignore[arg-type]
        assert await media.get(media_uri_for(b'payload')) == b'payload'
