"""Hypothesis-driven damage behind the store's back: files, rows and documents of one run.

After any damage to one run, every listing of it still works (what cannot be read is skipped and
logged), the `get_*` reads return a record or raise `ValueError`, and another run of the same store
reads back exactly as written. The damage never touches run ids (that would move records, not
corrupt them) or shared media (see tests/media for digests that no longer match).
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import anyio.to_thread
import pytest
from hypothesis import strategies as st
from sqlalchemy import update
from sqlalchemy.ext.asyncio import create_async_engine

from step_persistence import (
    ContinuableSnapshot,
    FileStepStore,
    MongoStepStore,
    RunRecord,
    SqlStepStore,
    StepEvent,
    StepStore,
    ToolEffectRecord,
)
from step_persistence.stores.sql.schema import events, runs, snapshots, tool_effects
from step_persistence.testing.conformance import sample_history
from support.databases import EmptyDatabase
from support.reliability_helpers import for_examples, write_sentinel
from support.servers.mongo import MongoServer, Scratch

pytestmark = pytest.mark.anyio

Damage = Callable[[str, Any], Awaitable[None]]


async def write_victim(store: StepStore, run_id: str) -> None:
    await store.register_run(RunRecord(run_id=run_id, metadata={'role': 'victim'}))
    for step, kind in enumerate(('run_started', 'model_request_started', 'run_completed')):
        await store.append_event(StepEvent(run_id=run_id, kind=kind, step_index=step, metadata={'n': str(step)}))
    for step in (1, 2, 3):
        state = 'interrupted' if step == 2 else 'complete'
        messages = sample_history(step, tag=run_id)
        await store.save_snapshot(ContinuableSnapshot(run_id=run_id, step_index=step, messages=messages, state=state))
    for call_id, status in (('a', 'started'), ('b', 'completed')):
        await store.record_tool_effect(
            ToolEffectRecord(run_id=run_id, tool_call_id=call_id, tool_name='t', status=status)
        )


class Collected(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


async def damage_is_contained(store: StepStore, damage: Damage, strategy: st.SearchStrategy[Any]) -> None:
    unchanged = await write_sentinel(store)
    counter = iter(range(10_000))
    outcomes = {'all readable': 0, 'something skipped or refused': 0, 'skipped and logged': 0}
    logged = Collected()
    logger = logging.getLogger('step_persistence')
    logger.addHandler(logged)
    try:
        await for_examples(strategy, partial(check_one, store, damage, counter, outcomes, logged, unchanged))
    finally:
        logger.removeHandler(logged)
    assert outcomes['something skipped or refused'] > 0 and outcomes['skipped and logged'] > 0, outcomes


async def check_one(
    store: StepStore,
    damage: Damage,
    counter: Iterator[int],
    outcomes: dict[str, int],
    logged: Collected,
    unchanged: Callable[[], Awaitable[None]],
    value: Any,
) -> None:
    run_id = f'victim-{next(counter)}'
    await write_victim(store, run_id)
    await damage(run_id, value)
    logged.records.clear()
    refused = 0
    listed = await store.list_runs()
    assert 'sentinel' in {run.run_id for run in listed}
    found = (
        len(await store.list_events(run_id=run_id)),
        len(await store.list_snapshots(run_id=run_id, include_interrupted=True)),
        len(await store.list_snapshots(run_id=run_id)),
        len(await store.list_unresolved_tool_effects(run_id=run_id)),
    )
    await store.latest_snapshot(run_id=run_id)
    await store.latest_snapshot(run_id=run_id, include_interrupted=True)
    for read in (
        lambda: store.get_run(run_id=run_id),
        lambda: store.get_tool_effect(run_id=run_id, tool_call_id='a'),
        lambda: store.get_tool_effect(run_id=run_id, tool_call_id='b'),
    ):
        try:
            await read()
        except ValueError:
            refused += 1
    complete = found == (3, 3, 2, 1) and run_id in {run.run_id for run in listed} and not refused
    outcomes['all readable' if complete else 'something skipped or refused'] += 1
    if found[0] < 3 or found[1] < 3 or run_id not in {run.run_id for run in listed}:
        assert logged.records, 'a record a listing skipped was logged'
        outcomes['skipped and logged'] += 1
    await unchanged()


# --- files ---

FILES = [
    'run.json',
    'registration.json',
    'run.lock',  # no data, only the run's incarnation token: a damaged one must not break reads either
    'events.jsonl',
    'tool_effects.jsonl',
    'snapshots.jsonl',
    'snapshots/3.json',
    'line/messages.jsonl',
    'line/line.json',
    'line/line.lock',  # like run.lock: only a token
]
file_damage = st.tuples(
    st.sampled_from(FILES),
    st.floats(min_value=0, max_value=1),
    st.one_of(st.binary(min_size=1, max_size=12), st.just(b'')),  # b'': truncate there
)


async def test_damaged_files_are_skipped_and_other_runs_untouched(tmp_path: Path) -> None:
    store = FileStepStore(tmp_path / 'store', fsync=False)

    def damage(run_id: str, value: tuple[str, float, bytes]) -> None:
        name, where, garbage = value
        run = tmp_path / 'store' / run_id
        if name.startswith('line/'):  # a file of the history line the run's snapshots are on
            newest = json.loads((run / 'snapshots.jsonl').read_bytes().splitlines()[-1])
            path = tmp_path / 'store' / '@lines' / newest['view']['line'] / name.removeprefix('line/')
        else:
            path = run / name
        data = path.read_bytes()
        offset = int(where * len(data))
        path.write_bytes(data[:offset] + garbage + (data[offset + len(garbage) :] if garbage else b''))

    async def damage_async(run_id: str, value: Any) -> None:
        await anyio.to_thread.run_sync(damage, run_id, value)

    await damage_is_contained(store, damage_async, file_damage)


# --- rows ---

SQL_TEXT_COLUMNS = [
    events.c.kind,
    events.c.tool_call_id,
    snapshots.c.state,
    snapshots.c.conversation_id,
    tool_effects.c.status,
    tool_effects.c.tool_name,
]
SQL_INT_COLUMNS = [snapshots.c.history_length, snapshots.c.through_message, snapshots.c.step_index, events.c.step_index]
SQL_JSON_COLUMNS = [runs.c.metadata, events.c.metadata]
sql_damage = st.one_of(
    st.tuples(st.sampled_from(SQL_TEXT_COLUMNS), st.text(max_size=10).filter(lambda text: '\x00' not in text)),
    st.tuples(st.sampled_from(SQL_INT_COLUMNS), st.integers(min_value=-(2**31), max_value=2**31 - 1)),
    st.tuples(
        st.sampled_from(SQL_JSON_COLUMNS),
        st.one_of(
            st.integers(), st.lists(st.integers(), max_size=2), st.dictionaries(st.text(max_size=3), st.integers())
        ),
    ),
)


@pytest.fixture
async def sql_store(empty_database: EmptyDatabase) -> AsyncIterator[tuple[SqlStepStore, str]]:
    async with SqlStepStore(empty_database.url) as store:
        yield store, empty_database.url


async def test_damaged_rows_are_skipped_and_other_runs_untouched(sql_store: tuple[SqlStepStore, str]) -> None:
    store, url = sql_store
    engine = create_async_engine(url)

    async def damage(run_id: str, value: tuple[Any, Any]) -> None:
        column, garbage = value
        async with engine.begin() as connection:
            await connection.execute(
                update(column.table).where(column.table.c.run_id == run_id).values({column.name: garbage})
            )

    try:
        await damage_is_contained(store, damage, sql_damage)
    finally:
        await engine.dispose()


# --- documents ---

MONGO_FIELDS = {
    'runs': ['started_at', 'metadata', 'agent_name', 'registration'],
    'events': ['kind', 'seq', 'timestamp', 'metadata', 'step_index'],
    'snapshots': ['state', 'seq', 'history_length', 'through_message', 'step_index'],
    'tool_effects': ['status', 'started_at', 'tool_name'],
    'messages': ['body', 'position', 'no'],
}
mongo_damage = st.tuples(
    st.sampled_from(sorted((collection, name) for collection, names in MONGO_FIELDS.items() for name in names)),
    st.one_of(
        st.none(),
        st.integers(min_value=-(2**62), max_value=2**62),
        st.text(max_size=8),
        st.lists(st.integers(), max_size=2),
        st.dictionaries(st.text(alphabet='abc', max_size=3), st.integers(), max_size=2),
    ),
    st.booleans(),  # unset the field instead
)


@pytest.fixture
async def mongo_scratch(mongo_server: MongoServer) -> AsyncIterator[Scratch]:
    async with mongo_server.scratch() as scratch:
        yield scratch


async def test_damaged_documents_are_skipped_and_other_runs_untouched(mongo_scratch: Scratch) -> None:
    database = mongo_scratch.fresh_database()
    store = MongoStepStore(client=mongo_scratch.client, database=database)

    async def damage(run_id: str, value: tuple[tuple[str, str], Any, bool]) -> None:
        (collection, name), garbage, unset = value
        query = {'_id': run_id} if collection == 'runs' else {'run_id': run_id}
        change = {'$unset': {name: ''}} if unset else {'$set': {name: garbage}}
        await mongo_scratch.client[database][collection].update_one(query, change)  # one document

    try:
        await damage_is_contained(store, damage, mongo_damage)
    finally:
        await store.aclose()
