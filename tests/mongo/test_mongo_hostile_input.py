"""MongoDB and hostile input (issue 16): ids and filters that are not strings, passwords in URLs.

A query operator passed as an id (`{'$ne': None}`) would match every document, so both Mongo
stores refuse every id, filter and blob key that is not a `str` with `TypeError` before a command
is sent. A URL's password never shows in an exception, a repr or a log record, whatever pymongo
makes of the URL.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import pytest

from step_persistence import MongoStepStore, RunRecord, StepEvent, ToolEffectRecord
from step_persistence.media import MediaContext
from step_persistence.media.protocol import StoredBlob
from step_persistence.stores.mongo.media_store import MongoMediaStore
from support.mongo_helpers import CommandLog, scratch, snapshot
from support.servers.mongo import MongoServer, Scratch

__all__ = ['scratch']

pytestmark = pytest.mark.anyio

NOT_TEXT: tuple[object, ...] = ({'$ne': None}, {'$gt': ''}, {'$regex': '.*'}, 5, 2.5, True, ['r'], (), b'r')
"""What a caller (or a model) might pass as an id: query operators, numbers, booleans, lists, bytes."""

Call = Callable[[], Awaitable[object]]


def step_store_calls(store: MongoStepStore, value: Any) -> dict[str, Call]:
    """Every public method of the step store taking an id or filter, with `value` as one of them."""
    return {
        'get_run': lambda: store.get_run(run_id=value),
        'list_runs(parent_run_id)': lambda: store.list_runs(parent_run_id=value),
        'list_runs(conversation_id)': lambda: store.list_runs(conversation_id=value),
        'list_runs(agent_name)': lambda: store.list_runs(agent_name=value),
        'list_runs(origin_run_id)': lambda: store.list_runs(origin_run_id=value),
        'list_conversations(agent_name)': lambda: store.list_conversations(agent_name=value),
        'find_snapshot(conversation_id)': lambda: store.find_snapshot(conversation_id=value, history_digest='0' * 64),
        'find_snapshot(history_digest)': lambda: store.find_snapshot(conversation_id='c', history_digest=value),
        'list_events': lambda: store.list_events(run_id=value),
        'latest_snapshot': lambda: store.latest_snapshot(run_id=value),
        'latest_snapshot(include_interrupted)': lambda: store.latest_snapshot(run_id=value, include_interrupted=True),
        'list_snapshots': lambda: store.list_snapshots(run_id=value),
        'get_tool_effect(run_id)': lambda: store.get_tool_effect(run_id=value, tool_call_id='a'),
        'get_tool_effect(tool_call_id)': lambda: store.get_tool_effect(run_id='r', tool_call_id=value),
        'list_unresolved_tool_effects': lambda: store.list_unresolved_tool_effects(run_id=value),
        'list_tool_effects': lambda: store.list_tool_effects(run_id=value),
        'delete_run': lambda: store.delete_run(run_id=value),
        'delete_run(cascade)': lambda: store.delete_run(run_id=value, cascade=True),
    }


def media_store_calls(media: MongoMediaStore, value: Any) -> dict[str, Call]:
    """Every public method of the media store taking a URI or key, with `value` as it."""

    async def key_for() -> object:
        return media.key_for(value)

    blob = StoredBlob(uri='media+sha256://' + '0' * 64, key=value, touched_at=datetime.now(UTC))
    return {
        'key_for': key_for,
        'get': lambda: media.get(value),
        'exists': lambda: media.exists(value),
        'touch': lambda: media.touch(value),
        'get_metadata': lambda: media.get_metadata(value),
        'public_url': lambda: media.public_url(value),
        'delete_blob': lambda: media.delete_blob(blob),
        'delete_blob(touched_before)': lambda: media.delete_blob(blob, touched_before=datetime.now(UTC)),
    }


async def outcomes(calls: dict[str, Call]) -> dict[str, str]:
    found: dict[str, str] = {}
    for name, call in calls.items():
        try:
            await call()
        except TypeError as error:
            found[name] = 'refused' if 'must be a string' in str(error) else repr(error)
        except Exception as error:
            found[name] = repr(error)
        else:
            found[name] = 'accepted'
    return found


@pytest.mark.parametrize('value', NOT_TEXT, ids=repr)
async def test_ids_and_filters_that_are_not_strings_never_reach_the_server(
    mongo_server: MongoServer, scratch: Scratch, value: object
) -> None:
    log = CommandLog()
    client = log.client(mongo_server.uri)
    try:
        store = MongoStepStore(client=client, database=scratch.fresh_database())
        for run_id in ('r', 'other'):
            await store.register_run(RunRecord(run_id=run_id, conversation_id='c', parent_run_id='p'))
            await store.append_event(StepEvent(run_id=run_id, kind='run_started', step_index=0))
            await store.save_snapshot(snapshot(run_id, 1))
            await store.record_tool_effect(
                ToolEffectRecord(run_id=run_id, tool_call_id='a', tool_name='t', status='started')
            )
        log.commands.clear()
        found = await outcomes(step_store_calls(store, value))
        assert found == dict.fromkeys(found, 'refused')
        assert log.commands == []
        assert [run.run_id for run in await store.list_runs(conversation_id='c')] == ['r', 'other']
        assert len(await store.list_events(run_id='other')) == 1
    finally:
        await client.close()


async def test_runs_started_before_needs_a_datetime(scratch: Scratch) -> None:
    store = MongoStepStore(client=scratch.client, database=scratch.fresh_database())
    with pytest.raises(TypeError, match='cutoff must be a datetime'):
        await store.runs_started_before({'$gt': None})  # type: ignore[arg-type]


@pytest.mark.parametrize('value', NOT_TEXT, ids=repr)
async def test_blob_uris_and_keys_that_are_not_strings_never_reach_the_server(
    mongo_server: MongoServer, scratch: Scratch, value: object
) -> None:
    log = CommandLog()
    client = log.client(mongo_server.uri)
    try:
        media = MongoMediaStore(client=client, database=scratch.fresh_database())
        uris = [await media.put(data, context=MediaContext(media_type='text/plain')) for data in (b'one', b'two')]
        log.commands.clear()
        found = await outcomes(media_store_calls(media, value))
        assert found == dict.fromkeys(found, 'refused')
        assert log.commands == []
        assert [await media.get(uri) for uri in uris] == [b'one', b'two']
    finally:
        await client.close()


# --- passwords in URLs ---

MARKER = 'MongoSecret3'
FAST = 'serverSelectionTimeoutMS=300&connectTimeoutMS=300'


def marked_urls(server: MongoServer) -> dict[str, str]:
    """URLs with the marker password: accepted, refused by the store, refused by pymongo, unreachable."""
    hosts = server.uri.split('://', 1)[1].rpartition('@')[2].split('/', 1)[0].split('?', 1)[0]
    return {
        'upper-case scheme, wrong password': f'MONGODB://admin:{MARKER}@{hosts}/db?{FAST}',
        'mixed-case srv scheme': f'MongoDB+SRV://admin:{MARKER}@no-such-host.invalid/db',
        'another scheme': f'POSTGRESQL://admin:{MARKER}@{hosts}/db',
        'another mongodb+ scheme': f'MONGODB+OTHER://admin:{MARKER}@{hosts}/db',
        'no scheme': f'admin:{MARKER}@{hosts}/db',
        'port that is not a number': f'mongodb://admin:{MARKER}@127.0.0.1:port/db',
        'password with a slash': f'mongodb://admin:Wr/{MARKER}@127.0.0.1:1/db',
        'unescaped at sign': f'mongodb://admin:{MARKER}@x@127.0.0.1:1/db',
        'empty authSource': f'mongodb://admin:{MARKER}@127.0.0.1:1/db?authSource=&{FAST}',
        'option pymongo refuses': f'mongodb://admin:{MARKER}@127.0.0.1:1,127.0.0.1:2/db?directConnection=true',
        'password as an option': f'mongodb://admin@127.0.0.1:1/db?password={MARKER}&{FAST}',
        'unreachable': f'mongodb://admin:{MARKER}@127.0.0.1:1/db?{FAST}',
    }


class Said:
    """Everything the stores said: exception texts (with their causes), reprs, log records."""

    def __init__(self, caplog: pytest.LogCaptureFixture) -> None:
        self._caplog = caplog
        self.texts: list[str] = []

    def add(self, value: object) -> None:
        seen: BaseException | object | None = value
        while seen is not None:
            self.texts.append(f'{seen!s} {seen!r}')
            seen = (seen.__cause__ or seen.__context__) if isinstance(seen, BaseException) else None

    async def attempt(self, call: Call) -> None:
        try:
            self.add(await call())
        except Exception as error:
            self.add(error)

    def leaks(self) -> list[str]:
        said = [*self.texts, *(record.getMessage() for record in self._caplog.records)]
        return [text for text in said if MARKER in text]


@pytest.mark.filterwarnings('ignore:Unknown option:UserWarning')  # pymongo on ?password=
@pytest.mark.parametrize('case', list(marked_urls(MongoServer(uri='mongodb://127.0.0.1:0'))))
@pytest.mark.parametrize('kind', [MongoStepStore, MongoMediaStore], ids=lambda kind: kind.__name__)
async def test_a_url_never_shows_its_password(
    mongo_server: MongoServer, caplog: pytest.LogCaptureFixture, case: str, kind: type[Any]
) -> None:
    caplog.set_level(logging.DEBUG)
    said = Said(caplog)
    try:
        store = kind(db_url=marked_urls(mongo_server)[case], database='db')
    except Exception as error:
        said.add(error)
        refused: Exception | None = error
    else:
        refused = None
        said.add(store)
        if isinstance(store, MongoStepStore):
            await said.attempt(lambda: store.register_run(RunRecord(run_id='secret')))
            await said.attempt(lambda: store.list_runs())
        else:
            await said.attempt(lambda: store.put(b'secret'))
        await said.attempt(store.aclose)
    assert refused is None or isinstance(refused, ValueError), repr(refused)  # pymongo's refusals too
    assert said.leaks() == []


def test_a_refused_url_hides_a_password_holding_a_space() -> None:
    with pytest.raises(ValueError, match='mongodb://') as refused:
        MongoStepStore(db_url=f'postgresql://admin:Mongo {MARKER}@host/db', database='db')
    assert MARKER not in str(refused.value)
