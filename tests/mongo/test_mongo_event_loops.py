"""A MongoDB store used from one event loop, then another (issue 15, item 1: `run_sync` and `asyncio.run` in turn).

Every `asyncio.run` here is a new event loop, as in an application alternating it with `run_sync`.
A store built from `db_url` builds a client for each loop it is used from and closes the one it
leaves on that loop; a caller's client is used as it is (docs/mongo.md). These tests are
synchronous: they make their loops themselves.
"""

from __future__ import annotations

import asyncio
import gc
import uuid
import warnings
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from anyio.from_thread import start_blocking_portal
from pydantic_ai.messages import ModelRequest, UserPromptPart
from pymongo import AsyncMongoClient, MongoClient
from pymongo.errors import InvalidOperation

from step_persistence import ContinuableSnapshot, MongoStepStore, RunRecord, StepEvent, ToolEffectRecord
from step_persistence.media import MediaContext
from step_persistence.media.protocol import StoredBlob
from step_persistence.records import StepWrites
from step_persistence.stores.mongo.media_store import MongoMediaStore
from support.servers import wait_until
from support.servers.mongo import MongoServer


@pytest.fixture
def database(mongo_server: MongoServer) -> Iterator[str]:
    """A fresh database name, dropped after the test (with a synchronous client: the test has no loop)."""
    name = f'test_{uuid.uuid4().hex[:16]}'
    yield name
    client: MongoClient[Any] = MongoClient(mongo_server.uri)
    try:
        client.drop_database(name)
    finally:
        client.close()


def snapshot(run_id: str, step_index: int, *prompts: str) -> ContinuableSnapshot:
    messages = [ModelRequest(parts=[UserPromptPart(prompt)]) for prompt in prompts]
    return ContinuableSnapshot(run_id=run_id, step_index=step_index, messages=messages)


async def collect(blobs: AsyncIterator[StoredBlob]) -> list[StoredBlob]:
    return [blob async for blob in blobs]


@contextmanager
def unclosed_clients() -> Iterator[list[str]]:
    """The 'Unclosed AsyncMongoClient' warnings pymongo gives when a client opened in the block is collected
    unclosed (the list is filled when the block ends, after a collection; what was garbage before is not counted)."""
    gc.collect()
    found: list[str] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always', ResourceWarning)
        yield found
        gc.collect()
    found.extend(str(warning.message) for warning in caught if 'Unclosed AsyncMongoClient' in str(warning.message))


def test_every_operation_follows_the_running_loop(mongo_server: MongoServer, database: str) -> None:
    """Each call on its own loop: the step store, then its default media store, then both in turn."""
    store = MongoStepStore(db_url=mongo_server.uri, database=database, media_threshold_bytes=1024)
    clients: list[Any] = []

    def on_a_new_loop(operation: Any) -> Any:
        result = asyncio.run(operation)
        clients.append(store.client)
        return result

    large = 'a large prompt ' * 200  # over the threshold: its text goes to the media store
    first = snapshot('run', 1, large)
    on_a_new_loop(store.register_run(RunRecord(run_id='run', conversation_id='chat')))
    started = ToolEffectRecord(run_id='run', tool_call_id='call', tool_name='lookup', status='started')
    on_a_new_loop(
        store.write_batch(
            StepWrites(
                tool_effects=[started],
                events=[StepEvent(run_id='run', kind='run_started', step_index=0)],
                snapshots=[first],
            )
        )
    )
    on_a_new_loop(store.append_event(StepEvent(run_id='run', kind='model_request_started', step_index=1)))
    on_a_new_loop(store.save_snapshot(snapshot('run', 2, large, 'and then')))
    on_a_new_loop(store.record_tool_effect(started.model_copy(update={'status': 'completed'})))
    assert on_a_new_loop(store.get_run(run_id='run')) is not None
    assert [run.run_id for run in on_a_new_loop(store.list_runs(conversation_id='chat'))] == ['run']
    [conversation] = on_a_new_loop(store.list_conversations())
    assert conversation.conversation_id == 'chat' and conversation.run_count == 1
    found = on_a_new_loop(store.find_snapshot(conversation_id='chat', history_digest=first.history_digest()))
    assert found is not None and found.run_id == 'run'
    assert [event.kind for event in on_a_new_loop(store.list_events(run_id='run'))] == [
        'run_started',
        'model_request_started',
    ]
    latest = on_a_new_loop(store.latest_snapshot(run_id='run'))
    assert latest is not None and latest.step_index == 2
    assert [kept.step_index for kept in on_a_new_loop(store.list_snapshots(run_id='run'))] == [1, 2]
    effect = on_a_new_loop(store.get_tool_effect(run_id='run', tool_call_id='call'))
    assert effect is not None and effect.status == 'completed'
    assert on_a_new_loop(store.list_unresolved_tool_effects(run_id='run')) == []
    assert len(on_a_new_loop(store.list_tool_effects(run_id='run'))) == 1
    cutoff = datetime.now(UTC) + timedelta(minutes=1)
    assert [run.run_id for run in on_a_new_loop(store.runs_started_before(cutoff))] == ['run']
    on_a_new_loop(store.create_indexes())

    media = store.media_store
    assert isinstance(media, MongoMediaStore)
    [blob] = on_a_new_loop(collect(media.list_blobs()))
    assert on_a_new_loop(media.exists(blob.uri)) and on_a_new_loop(media.touch(blob.uri))
    assert large.encode() in on_a_new_loop(media.get(blob.uri))
    uri = on_a_new_loop(media.put(b'a blob of its own', context=MediaContext(metadata={'kind': 'note'})))
    assert on_a_new_loop(media.get_metadata(uri)) == {'kind': 'note'}
    assert asyncio.run(media.public_url(uri)) is None  # reaches no database

    on_a_new_loop(store.delete_run(run_id='run'))
    assert on_a_new_loop(store.get_run(run_id='run')) is None
    collected = on_a_new_loop(store.collect_media(grace=timedelta(0)))
    assert collected.blobs == 2  # the prompt's, no longer used, and the one put directly
    assert on_a_new_loop(store.prune_runs(older_than=cutoff)) == []
    assert len({id(client) for client in clients}) == len(clients), 'a client of its own on every loop'
    asyncio.run(store.aclose())
    assert store.client is clients[-1], 'closing builds no client'


def test_the_clients_it_leaves_are_closed_on_their_loops(mongo_server: MongoServer, database: str) -> None:
    """A loop shut down by `asyncio.run` closes its client; `aclose()` closes the last one, on its loop."""
    with unclosed_clients() as unclosed:
        store = MongoStepStore(db_url=mongo_server.uri, database=database)
        asyncio.run(store.register_run(RunRecord(run_id='run')))
        for turn in range(3):
            asyncio.run(store.append_event(StepEvent(run_id='run', kind='run_started', step_index=turn)))
        with asyncio.Runner() as runner:
            assert len(runner.run(store.list_events(run_id='run'))) == 3
            runner.run(store.aclose())
            with pytest.raises(InvalidOperation):
                runner.run(store.client.admin.command('ping'))
        with pytest.raises(InvalidOperation, match='after aclose'):
            asyncio.run(store.get_run(run_id='run'))  # closed stays closed: no client is built for a new loop
        del store
    assert unclosed == []


def test_a_client_left_on_a_loop_running_in_another_thread_is_closed_there(
    mongo_server: MongoServer, database: str
) -> None:
    store = MongoStepStore(db_url=mongo_server.uri, database=database)
    with start_blocking_portal() as portal:
        portal.call(store.register_run, RunRecord(run_id='run'))
        left = store.client
        assert asyncio.run(store.get_run(run_id='run')) is not None
        assert store.client is not left

        def closed() -> bool:
            try:
                portal.call(left.admin.command, 'ping')
            except InvalidOperation:
                return True
            return False

        wait_until(closed, timeout=10, what="the client left on the portal's loop closing")
    asyncio.run(store.aclose())


def test_two_loops_in_turn_give_both_stores_one_client_per_loop(mongo_server: MongoServer, database: str) -> None:
    """The step store and its default media store share a client: whichever moves it to a loop, the other follows."""
    with unclosed_clients() as unclosed:
        store = MongoStepStore(db_url=mongo_server.uri, database=database)
        media = store.media_store
        assert isinstance(media, MongoMediaStore)
        with asyncio.Runner() as first, asyncio.Runner() as second:
            first.run(store.register_run(RunRecord(run_id='run')))
            uri = second.run(media.put(b'put on the second loop'))
            first.run(store.append_event(StepEvent(run_id='run', kind='run_started', step_index=0)))
            assert second.run(media.get(uri)) == b'put on the second loop'
            assert len(first.run(store.list_events(run_id='run'))) == 1
            first.run(store.aclose())
        del store, media
    assert unclosed == []


def test_a_media_store_built_from_a_url_follows_the_loop(mongo_server: MongoServer, database: str) -> None:
    media = MongoMediaStore(db_url=mongo_server.uri, database=database, chunk_size_bytes=4)
    uri = asyncio.run(media.put(b'in three chunks'))
    assert asyncio.run(media.get(uri)) == b'in three chunks'
    assert asyncio.run(media.delete_blob(StoredBlob(uri, uri.removeprefix('media+sha256://'), datetime.now(UTC))))
    assert not asyncio.run(media.exists(uri))
    asyncio.run(media.aclose())


def test_a_callers_client_is_used_as_it_is(mongo_server: MongoServer, database: str) -> None:
    """The store never replaces a client it was given: the caller uses it from one loop (pymongo refuses another)."""
    with asyncio.Runner() as runner:
        client: AsyncMongoClient[Any] = AsyncMongoClient(mongo_server.uri)
        store = MongoStepStore(client=client, database=database)
        runner.run(store.register_run(RunRecord(run_id='run')))
        with pytest.raises(RuntimeError, match='different event loop'):
            asyncio.run(store.get_run(run_id='run'))
        assert store.client is client
        runner.run(store.aclose())
        assert runner.run(client.admin.command('ping'))['ok'] == 1
        runner.run(client.close())
