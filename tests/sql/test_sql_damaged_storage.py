"""Stored data damaged so that trusting it would cost dearly (issue 16, items 3, 5 and 6), on SQLite and PostgreSQL.

- A blob whose bytes were changed (one byte flipped, same length) is never reused as it is: a save of
  the same payload writes the bytes again, so the new snapshot reads back exactly (and the old ones
  too); `touch` says a corrupt blob is not stored.
- A stored position or history length is a number a reader could allocate by: a message row claiming
  position 1 000 000 000 (or a negative one, or on SQLite one that is not an integer), a snapshot
  claiming 5 000 000 messages. Reads and later saves of the run stay within a few megabytes, the
  damaged row or snapshot is skipped and logged, everything else reads back exactly, and a later
  snapshot of the run is not made unreadable by the damaged row.
- A message body changed behind the store's back (one character, still a valid message) is never
  returned as the message: the snapshots that use it are skipped and logged.
"""

from __future__ import annotations

import logging
import tracemalloc
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from pydantic_ai.messages import BinaryContent, ModelMessage, ModelMessagesTypeAdapter, ModelRequest, UserPromptPart
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from step_persistence import ContinuableSnapshot, RunRecord, SqlStepStore
from step_persistence.media import SqlMediaStore, media_uri_for
from step_persistence.testing.conformance import T0, sample_history
from support.databases import EmptyDatabase

pytestmark = pytest.mark.anyio

PAYLOAD = bytes(range(256)) * 400


def with_payload(words: str) -> list[ModelMessage]:
    content = [words, BinaryContent(data=PAYLOAD, media_type='application/octet-stream')]
    return [ModelRequest(parts=[UserPromptPart(content=content, timestamp=T0)])]


def dump(messages: list[ModelMessage]) -> bytes:
    return ModelMessagesTypeAdapter.dump_json(messages)


@pytest.fixture
async def engine(empty_database: EmptyDatabase) -> AsyncIterator[AsyncEngine]:
    engine = create_async_engine(empty_database.url)
    yield engine
    await engine.dispose()


async def execute(engine: AsyncEngine, statement: str, **values: Any) -> None:
    async with engine.begin() as connection:
        await connection.execute(text(statement), values)


async def flip_a_byte(engine: AsyncEngine) -> None:
    """Change one byte in the middle of the stored payload, keeping its length."""
    async with engine.begin() as connection:
        digest = media_uri_for(PAYLOAD).removeprefix('media+sha256://')
        stored = (await connection.execute(text('SELECT data FROM media WHERE digest = :d'), {'d': digest})).scalar()
        damaged = bytearray(stored)
        damaged[len(damaged) // 2] ^= 0x01
        await connection.execute(
            text('UPDATE media SET data = :data WHERE digest = :d'), {'data': bytes(damaged), 'd': digest}
        )


# --- item 5: a corrupt blob ---


async def test_a_save_of_a_corrupt_blobs_payload_writes_it_again(
    empty_database: EmptyDatabase, engine: AsyncEngine, caplog: pytest.LogCaptureFixture
) -> None:
    async with SqlStepStore(empty_database.url) as store:
        await store.register_run(RunRecord(run_id='first'))
        await store.save_snapshot(ContinuableSnapshot(run_id='first', step_index=1, messages=with_payload('first')))
    await flip_a_byte(engine)
    async with SqlStepStore(empty_database.url) as store:  # a process that never saw the blob
        assert await store.latest_snapshot(run_id='first') is None, 'the corrupt blob is noticed on read'
        await store.register_run(RunRecord(run_id='second'))
        with caplog.at_level(logging.WARNING, logger='step_persistence'):
            await store.save_snapshot(
                ContinuableSnapshot(run_id='second', step_index=1, messages=with_payload('second'))
            )
        assert any('corrupt' in record.getMessage() for record in caplog.records)
        for run_id in ('second', 'first'):
            latest = await store.latest_snapshot(run_id=run_id)
            assert latest is not None and dump(latest.messages) == dump(with_payload(run_id)), run_id


async def test_the_media_store_repairs_a_corrupt_blob_when_it_is_put_again(
    empty_database: EmptyDatabase, engine: AsyncEngine
) -> None:
    async with SqlMediaStore(empty_database.url) as media:
        uri = await media.put(PAYLOAD)
        assert await media.touch(uri)
        await flip_a_byte(engine)
        with pytest.raises(ValueError, match='corrupt'):
            await media.get(uri)
        assert not await media.touch(uri), 'a corrupt blob is not stored'
        assert await media.put(PAYLOAD) == uri
        assert await media.get(uri) == PAYLOAD
        assert await media.touch(uri)


# --- item 6: positions and lengths a reader would allocate by ---


async def bounded(action: Callable[[], Awaitable[Any]], *, megabytes: int = 20) -> Any:
    """`action()`'s result, checking that it allocated at most `megabytes` at its peak (threads included)."""
    tracemalloc.start()
    try:
        result = await action()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < megabytes * 2**20, f'{peak / 2**20:.0f} MB allocated'
    return result


async def write_run(store: SqlStepStore) -> None:
    await store.register_run(RunRecord(run_id='r'))
    for step in (1, 2, 3):
        await store.save_snapshot(ContinuableSnapshot(run_id='r', step_index=step, messages=sample_history(step)))


RUN_LINE = "(SELECT line_id FROM snapshots WHERE run_id = 'r' AND seq = 1)"
NEWEST_MESSAGE = f'line_id = {RUN_LINE} AND no = (SELECT max(no) FROM messages WHERE line_id = {RUN_LINE})'
NEWEST_SNAPSHOT = "run_id = 'r' AND seq = 3"

DAMAGES = {
    'position 1000000000': f'UPDATE messages SET position = 1000000000 WHERE {NEWEST_MESSAGE}',
    'position -1': f'UPDATE messages SET position = -1 WHERE {NEWEST_MESSAGE}',
    'position 999999999 numbered 1000000000': (
        f'UPDATE messages SET position = 999999999, no = 1000000000 WHERE {NEWEST_MESSAGE}'
    ),
    'history of 5000000 messages': (
        f'UPDATE snapshots SET history_length = 5000000, through_message = 10000000 WHERE {NEWEST_SNAPSHOT}'
    ),
    'history longer than its messages': f'UPDATE snapshots SET history_length = 2000000 WHERE {NEWEST_SNAPSHOT}',
}
SQLITE_DAMAGES = {
    'position that is text': f"UPDATE messages SET position = 'x' WHERE {NEWEST_MESSAGE}",
    'position that is a fraction': f'UPDATE messages SET position = 2.5 WHERE {NEWEST_MESSAGE}',
}


@pytest.mark.parametrize('damage', [*DAMAGES, *SQLITE_DAMAGES])
async def test_a_damaged_position_or_length_allocates_nothing_and_hides_nothing_else(
    empty_database: EmptyDatabase, engine: AsyncEngine, damage: str, caplog: pytest.LogCaptureFixture
) -> None:
    if damage in SQLITE_DAMAGES and empty_database.dialect != 'sqlite':
        pytest.skip('PostgreSQL keeps integers in integer columns')
    async with SqlStepStore(empty_database.url) as store:
        await write_run(store)
        before = [dump(snapshot.messages) for snapshot in await store.list_snapshots(run_id='r')]
    await execute(engine, {**DAMAGES, **SQLITE_DAMAGES}[damage])
    async with SqlStepStore(empty_database.url) as store:  # reads the run's rows afresh
        with caplog.at_level(logging.WARNING, logger='step_persistence'):
            listed = await bounded(lambda: store.list_snapshots(run_id='r'))
            latest = await bounded(lambda: store.latest_snapshot(run_id='r'))
        assert [dump(snapshot.messages) for snapshot in listed] == before[:2], 'only the newest snapshot is damaged'
        assert latest is not None and dump(latest.messages) == before[1], 'the latest read falls back'
        assert any('snapshot 3' in record.getMessage() for record in caplog.records)
        saved = sample_history(4)
        await bounded(lambda: store.save_snapshot(ContinuableSnapshot(run_id='r', step_index=4, messages=saved)))
        latest = await store.latest_snapshot(run_id='r')
        assert latest is not None and latest.step_index == 4 and dump(latest.messages) == dump(saved)


# --- nothing tampered returned as true ---


async def test_a_message_changed_behind_the_stores_back_is_never_returned(
    empty_database: EmptyDatabase, engine: AsyncEngine, caplog: pytest.LogCaptureFixture
) -> None:
    async with SqlStepStore(empty_database.url) as store:
        await write_run(store)
    # One character of a message every snapshot uses, same length: valid JSON, a valid message.
    if empty_database.dialect == 'sqlite':
        await execute(engine, "UPDATE messages SET body = REPLACE(body, 'start  ', 'START  ')")
    else:
        await execute(engine, "UPDATE messages SET body = REPLACE(body::text, 'start  ', 'START  ')::json")
    async with SqlStepStore(empty_database.url) as store:
        with caplog.at_level(logging.WARNING, logger='step_persistence'):
            assert await store.list_snapshots(run_id='r') == []
            assert await store.latest_snapshot(run_id='r') is None
        assert any('does not match its digest' in record.getMessage() for record in caplog.records)
