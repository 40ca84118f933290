"""Large payloads of the SQL store: one row each in the `media` table, written in the save's transaction."""

from __future__ import annotations

import logging
import sqlite3
from datetime import timedelta
from pathlib import Path
from typing import Any

import anyio
import pytest
from pydantic_ai.messages import BinaryContent, ModelMessage, ModelMessagesTypeAdapter, ModelRequest, UserPromptPart
from sqlalchemy import Text, cast, delete, func, select, text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from step_persistence import ContinuableSnapshot, RunRecord, SqliteStepStore, SqlStepStore
from step_persistence.media import MediaContext, PostgresMediaStore, SqliteMediaStore, SqlMediaStore, media_uri_for
from step_persistence.reclaiming import MediaCollection
from step_persistence.stores.sql.schema import media, messages
from step_persistence.testing.conformance import T0
from support.databases import EmptyDatabase

pytestmark = pytest.mark.anyio

IMAGES = [bytes([number]) * 100_000 for number in range(3)]
TEXT = 'é' * 40_000
"""80 000 UTF-8 bytes: above the default threshold of 64 KiB."""


def prompt(*content: Any) -> ModelRequest:
    return ModelRequest(parts=[UserPromptPart(content=list(content), timestamp=T0)])


def with_payloads(*images: bytes, text: str = TEXT) -> list[ModelMessage]:
    return [prompt('describe these', *(BinaryContent(data=image, media_type='image/png') for image in images), text)]


def snapshot(step: int, history: list[ModelMessage], run_id: str = 'r') -> ContinuableSnapshot:
    return ContinuableSnapshot(run_id=run_id, step_index=step, messages=history)


def dump(history: list[ModelMessage]) -> bytes:
    return ModelMessagesTypeAdapter.dump_json(history)


async def count_and_size(engine: AsyncEngine) -> tuple[int, int, int]:
    """Media rows, message rows, and the total length of the message bodies."""
    async with engine.connect() as connection:
        blobs = (await connection.execute(select(func.count()).select_from(media))).scalar_one()
        rows, size = (
            await connection.execute(select(func.count(), func.sum(func.length(cast(messages.c.body, Text)))))
        ).one()
    return blobs, rows, size or 0


@pytest.fixture
async def engine(empty_database: EmptyDatabase) -> Any:
    engine = create_async_engine(empty_database.url)
    async with SqlStepStore(engine) as store:
        await store.migrate()
    yield engine
    await engine.dispose()


async def test_payloads_go_to_the_media_table_once_and_come_back_exactly(engine: AsyncEngine) -> None:
    grown = [*with_payloads(*IMAGES), prompt('and again'), *with_payloads(*IMAGES)]
    async with SqlStepStore(engine) as store:
        assert isinstance(store.media_store, SqlMediaStore)
        await store.register_run(RunRecord(run_id='r'))
        await store.save_snapshot(snapshot(1, with_payloads(*IMAGES)))
        await store.save_snapshot(snapshot(2, grown))
        assert [dump(s.messages) for s in await store.list_snapshots(run_id='r')] == [
            dump(with_payloads(*IMAGES)),
            dump(grown),
        ]
        latest = await store.latest_snapshot(run_id='r')
        assert latest is not None and dump(latest.messages) == dump(grown)
        for image in IMAGES:
            assert await store.media_store.get(media_uri_for(image)) == image
    blobs, rows, size = await count_and_size(engine)
    assert (blobs, rows) == (4, 3), 'three images and the text, once each'
    assert size < 5_000, 'message bodies hold markers, not payloads'


async def test_the_threshold_decides_which_strings_move(engine: AsyncEngine) -> None:
    history = [prompt('a' * 999), prompt('b' * 1000)]
    async with SqlStepStore(engine, media_threshold_bytes=1000) as store:
        await store.register_run(RunRecord(run_id='r'))
        await store.save_snapshot(snapshot(1, history))
        assert await store.media_store.exists(media_uri_for(b'b' * 1000))  # type: ignore[union-attr]
        latest = await store.latest_snapshot(run_id='r')
        assert latest is not None and dump(latest.messages) == dump(history)
    blobs, _, _ = await count_and_size(engine)
    assert blobs == 1


async def test_without_a_media_store_everything_stays_inline(engine: AsyncEngine) -> None:
    async with SqlStepStore(engine, media_store=None) as store:
        assert store.media_store is None
        await store.register_run(RunRecord(run_id='r'))
        await store.save_snapshot(snapshot(1, with_payloads(*IMAGES)))
        latest = await store.latest_snapshot(run_id='r')
        assert latest is not None and dump(latest.messages) == dump(with_payloads(*IMAGES))
    blobs, _, size = await count_and_size(engine)
    assert blobs == 0 and size > 3 * 100_000


async def test_a_rolled_back_transaction_takes_its_blobs_along_and_a_retry_stores_them_again(
    engine: AsyncEngine,
) -> None:
    async with engine.connect() as connection:
        store = SqlStepStore(connection)
        for outcome in ('rolled back', 'committed'):
            transaction = await connection.begin()
            await store.register_run(RunRecord(run_id='tentative'))
            await store.save_snapshot(snapshot(1, with_payloads(IMAGES[0]), run_id='tentative'))
            if outcome == 'rolled back':
                await transaction.rollback()
                assert (await count_and_size(engine))[0] == 0
            else:
                await transaction.commit()
    assert (await count_and_size(engine))[0] == 2
    async with SqlStepStore(engine) as reader:
        latest = await reader.latest_snapshot(run_id='tentative')
        assert latest is not None and dump(latest.messages) == dump(with_payloads(IMAGES[0]))


@pytest.mark.parametrize('kind', ['memory', 'sqlite3 connection'])
async def test_single_connection_stores_write_blobs_in_their_own_transaction(tmp_path: Path, kind: str) -> None:
    connection = sqlite3.connect(tmp_path / 'app.db', check_same_thread=False)
    try:
        store = SqliteStepStore(':memory:') if kind == 'memory' else SqliteStepStore(connection=connection)
        async with store:
            await store.register_run(RunRecord(run_id='r'))
            with anyio.fail_after(30):
                await store.save_snapshot(snapshot(1, with_payloads(*IMAGES)))
                latest = await store.latest_snapshot(run_id='r')
            assert latest is not None and dump(latest.messages) == dump(with_payloads(*IMAGES))
    finally:
        connection.close()


async def test_a_missing_blob_makes_its_snapshots_unreadable_and_reads_fall_back(
    engine: AsyncEngine, caplog: pytest.LogCaptureFixture
) -> None:
    plain = [prompt('nothing large')]
    async with SqlStepStore(engine) as store:
        await store.register_run(RunRecord(run_id='r'))
        await store.save_snapshot(snapshot(1, plain))
        await store.save_snapshot(snapshot(2, [*plain, *with_payloads(IMAGES[0])]))
        async with engine.begin() as connection:
            await connection.execute(delete(media).where(media.c.data == IMAGES[0]))
        with caplog.at_level(logging.WARNING, logger='step_persistence'):
            latest = await store.latest_snapshot(run_id='r')
            assert latest is not None and latest.seq == 1
            assert [s.seq for s in await store.list_snapshots(run_id='r')] == [1]
    assert any(
        'snapshot 2' in record.getMessage() and 'FileNotFoundError' in record.getMessage() for record in caplog.records
    )


async def test_a_store_without_a_media_store_skips_what_needs_one(
    engine: AsyncEngine, caplog: pytest.LogCaptureFixture
) -> None:
    plain = [prompt('nothing large')]
    async with SqlStepStore(engine) as writer:
        await writer.register_run(RunRecord(run_id='r'))
        await writer.save_snapshot(snapshot(1, plain))
        await writer.save_snapshot(snapshot(2, [*plain, *with_payloads(IMAGES[0])]))
    async with SqlStepStore(engine, media_store=None) as reader:
        with caplog.at_level(logging.WARNING, logger='step_persistence'):
            latest = await reader.latest_snapshot(run_id='r')
        assert latest is not None and latest.seq == 1, 'messages without payloads need no media store'
    assert any('media store' in record.getMessage() for record in caplog.records)


async def test_pruning_and_deleting_runs_never_delete_media(engine: AsyncEngine) -> None:
    async with SqlStepStore(engine, max_snapshots_per_run=1) as store:
        for run_id in ('first', 'second'):
            await store.register_run(RunRecord(run_id=run_id))
            for step in range(1, 4):
                await store.save_snapshot(snapshot(step, with_payloads(IMAGES[0], text=f'{TEXT}{step}'), run_id))
        await store.delete_run(run_id='first')
        latest = await store.latest_snapshot(run_id='second')
        assert latest is not None and dump(latest.messages) == dump(with_payloads(IMAGES[0], text=f'{TEXT}3'))
    assert (await count_and_size(engine))[0] == 1 + 3, 'the image, and the text of each step'


async def test_a_media_store_on_an_engine_or_connection_leaves_them_to_the_caller(engine: AsyncEngine) -> None:
    async with SqlMediaStore(engine) as on_engine:
        context = MediaContext(media_type='text/plain', filename='kept.txt', metadata={'origin': 'test'})
        uri = await on_engine.put(b'kept', context=context)
    assert (await count_and_size(engine))[0] == 1
    async with engine.connect() as connection:
        transaction = await connection.begin()
        async with SqlMediaStore(connection) as on_connection:
            await on_connection.put(b'undone')
            assert await on_connection.exists(media_uri_for(b'undone'))
        assert connection.in_transaction() and not connection.closed
        await transaction.rollback()
    async with SqlMediaStore(engine) as reader:
        assert await reader.get(uri) == b'kept'
        assert not await reader.exists(media_uri_for(b'undone'))
        assert dict(await reader.get_metadata(uri)) == {'origin': 'test'}


async def test_sqlite_media_store_creates_its_database(tmp_path: Path) -> None:
    async with SqliteMediaStore(tmp_path / 'new' / 'media.db') as store:
        uri = await store.put(b'blob')
    async with SqliteStepStore(tmp_path / 'new' / 'media.db') as steps:
        assert await steps.media_store.get(uri) == b'blob'  # type: ignore[union-attr]


async def test_postgres_media_store_in_a_schema(postgres_database: EmptyDatabase) -> None:
    async with PostgresMediaStore(postgres_database.url, schema='blobs') as store:
        uri = await store.put(b'in a schema')
        assert await store.get(uri) == b'in a schema'
    assert 'media' in await postgres_database.table_names(schema='blobs')
    assert 'media' not in await postgres_database.table_names()


async def test_front_doors_refuse_the_other_dialect(tmp_path: Path) -> None:
    engine = create_async_engine(f'sqlite+aiosqlite:///{tmp_path / "x.db"}')
    try:
        with pytest.raises(ValueError, match='PostgresMediaStore needs a PostgreSQL database'):
            PostgresMediaStore(engine)
        with pytest.raises(ValueError, match='PostgresMediaStore needs a PostgreSQL database'):
            PostgresMediaStore('sqlite:///x.db')
    finally:
        await engine.dispose()
    with pytest.raises(ValueError, match=r'postgresql.*sqlite'):
        SqlMediaStore('mysql://db.example/x')


async def test_a_media_store_given_table_keeps_its_blobs_in_that_table(
    empty_database: EmptyDatabase, tmp_path: Path
) -> None:
    """`SqliteMediaStore(table=...)` (the seed's way to move the rows): the blobs in a table of that name, created
    by the media store's first write; the step store's own `media` table stays empty."""
    if empty_database.dialect == 'sqlite':
        database = empty_database.url.removeprefix('sqlite+aiosqlite:///')
        blobs: SqlMediaStore = SqliteMediaStore(database, table='app_blobs')
    else:
        blobs = PostgresMediaStore(empty_database.url, table='app_blobs')
    async with blobs:
        assert [blob async for blob in blobs.list_blobs()] == [] and not await blobs.exists(media_uri_for(b'x'))
        assert await empty_database.table_names() == set(), 'reading created nothing'
        async with SqlStepStore(empty_database.url, media_store=blobs) as store:
            await store.register_run(RunRecord(run_id='r'))
            await store.save_snapshot(snapshot(1, with_payloads(*IMAGES)))
            latest = await store.latest_snapshot(run_id='r')
            assert latest is not None and dump(latest.messages) == dump(with_payloads(*IMAGES))
            collected = await store.collect_media(grace=timedelta(0))
            assert collected == MediaCollection(messages=0, blobs=0), 'every blob is referenced'
        stored = sorted([blob.key async for blob in blobs.list_blobs()])
        assert stored == sorted(
            media_uri_for(payload).removeprefix('media+sha256://') for payload in [*IMAGES, TEXT.encode()]
        )
    engine = create_async_engine(empty_database.url)
    try:
        async with engine.connect() as connection:
            assert (await connection.execute(select(func.count()).select_from(media))).scalar_one() == 0
            own = (await connection.execute(text('SELECT count(*) FROM app_blobs'))).scalar_one()
        assert own == 4
    finally:
        await engine.dispose()
    assert 'app_blobs' in await empty_database.table_names()
    with pytest.raises(ValueError, match='lower-case'):
        SqliteMediaStore(tmp_path / 'x.db', table='Blobs; DROP TABLE runs')
