"""Messages are stored once per history line, position and version; a snapshot refers to them in constant space.

A run's snapshots share one line; a chat's runs (each continuing the previous run's snapshot) share it
too, and branch into a line of their own only when another writer appended to it since.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelMessagesTypeAdapter, ModelRequest, UserPromptPart
from pydantic_ai.usage import UsageLimits
from sqlalchemy import Text, cast, func, select
from sqlalchemy.ext.asyncio import create_async_engine

from step_persistence import ContinuableSnapshot, RunRecord, SqlStepStore, StepPersistence
from step_persistence._history import HistoryEncoder
from step_persistence.conversations import delete_conversation
from step_persistence.records import RunOrigin
from step_persistence.stores.sql.schema import history_lines, messages, snapshots
from step_persistence.testing.conformance import T0, sample_history
from step_persistence.testing.conformance.conversations import chat_history
from support.databases import EmptyDatabase, statements_sent
from support.processes import write_concurrently
from support.scripted import calls, scripted, text, turn_step
from support.shared_run_writer import RUN_ID, SCRIPT, history_for

pytestmark = pytest.mark.anyio


def dump(history: list[ModelMessage]) -> Any:
    return ModelMessagesTypeAdapter.dump_python(history, mode='json')


def snapshot(run_id: str, history: list[ModelMessage], step: int, encoder: HistoryEncoder) -> ContinuableSnapshot:
    return ContinuableSnapshot.from_encoded(
        run_id=run_id,
        step_index=step,
        messages=history,
        encoded=encoder.encode(history).messages,
        state='complete',
        conversation_id=None,
        parent_run_id=None,
        agent_name=None,
        idempotency_key=None,
    )


@dataclass
class Stored:
    """What the tables hold for one run."""

    message_rows: int
    """Rows of the lines the run's snapshots are on."""
    message_bytes: int
    references: list[tuple[int, int]]
    """`(history_length, through_message)` of every snapshot, in sequence order."""
    snapshot_row_bytes: list[int]
    """Every snapshot row's size: the text length of all its values."""
    lines: set[int]


async def stored(url: str, run_id: str) -> Stored:
    engine = create_async_engine(url)
    try:
        async with engine.connect() as connection:
            rows = (
                await connection.execute(
                    select(snapshots).where(snapshots.c.run_id == run_id).order_by(snapshots.c.seq)
                )
            ).all()
            lines = {row.line_id for row in rows}
            count, size = (
                await connection.execute(
                    select(func.count(), func.sum(func.length(cast(messages.c.body, Text)))).where(
                        messages.c.line_id.in_(lines)
                    )
                )
            ).one()
    finally:
        await engine.dispose()
    return Stored(
        message_rows=count,
        message_bytes=size or 0,
        references=[(row.history_length, row.through_message) for row in rows],
        snapshot_row_bytes=[sum(len(str(value)) for value in row if value is not None) for row in rows],
        lines=lines,
    )


async def count_rows(url: str, table: Any) -> int:
    engine = create_async_engine(url)
    try:
        async with engine.connect() as connection:
            return (await connection.execute(select(func.count()).select_from(table))).scalar_one()
    finally:
        await engine.dispose()


async def test_a_run_of_k_steps_writes_each_message_once(empty_database: EmptyDatabase) -> None:
    steps = 30
    history = sample_history(steps, tag='long')
    encoder = HistoryEncoder()
    async with SqlStepStore(empty_database.url, media_store=None) as store:
        await store.register_run(RunRecord(run_id='long'))
        for step in range(1, steps + 1):
            await store.save_snapshot(snapshot('long', history[: 2 * step + 1], step, encoder))
        latest = await store.latest_snapshot(run_id='long')
        assert latest is not None and dump(latest.messages) == dump(history)
    found = await stored(empty_database.url, 'long')
    assert found.message_rows == len(history)
    assert found.message_bytes <= sum(len(message.data) for message in encoder.encode(history).messages) + 2
    assert found.references == [(2 * step + 1, 2 * step + 1) for step in range(1, steps + 1)]


async def test_a_message_completed_in_place_gets_a_new_version_and_older_snapshots_keep_theirs(
    empty_database: EmptyDatabase,
) -> None:
    prefix = sample_history(1, tag='inplace')
    newest = ModelRequest(parts=[UserPromptPart(content='newest', timestamp=T0)])
    completed = ModelRequest(parts=[UserPromptPart(content='newest', timestamp=T0)], run_id='completed later')
    histories = [[*prefix, newest], [*prefix, completed, *sample_history(1, tag='next')]]
    async with SqlStepStore(empty_database.url) as store:
        await store.register_run(RunRecord(run_id='inplace'))
        for step, history in enumerate(histories, start=1):
            await store.save_snapshot(ContinuableSnapshot(run_id='inplace', step_index=step, messages=history))
        assert [dump(s.messages) for s in await store.list_snapshots(run_id='inplace')] == [dump(h) for h in histories]
    found = await stored(empty_database.url, 'inplace')
    assert found.message_rows == len(histories[0]) + 1 + 3, 'the completed message is a second version of position 3'
    assert found.references == [(4, 4), (7, 8)]


async def test_a_second_store_on_the_same_run_reuses_the_stored_messages(empty_database: EmptyDatabase) -> None:
    history = sample_history(4, tag='shared')
    async with SqlStepStore(empty_database.url) as first:
        await first.register_run(RunRecord(run_id='shared'))
        await first.save_snapshot(snapshot('shared', history[:5], 2, HistoryEncoder()))
    async with SqlStepStore(empty_database.url) as second:
        await second.save_snapshot(snapshot('shared', history, 4, HistoryEncoder()))
        snapshots_read = await second.list_snapshots(run_id='shared')
        assert [dump(s.messages) for s in snapshots_read] == [dump(history[:5]), dump(history)]
    assert (await stored(empty_database.url, 'shared')).message_rows == len(history)


async def test_stores_taking_turns_on_one_run_catch_up_with_each_other(empty_database: EmptyDatabase) -> None:
    async with SqlStepStore(empty_database.url) as first, SqlStepStore(empty_database.url) as second:
        await first.register_run(RunRecord(run_id=RUN_ID))
        saved: list[int] = []
        for step in range(1, 9):
            writer = step % 2
            store = (first, second)[writer]
            index = writer * 100 + step
            await store.save_snapshot(ContinuableSnapshot(run_id=RUN_ID, step_index=index, messages=history_for(index)))
            saved.append(index)
        for reader in (first, second):
            read = await reader.list_snapshots(run_id=RUN_ID)
            assert [s.step_index for s in read] == saved
            assert all(dump(s.messages) == dump(history_for(s.step_index)) for s in read)


async def test_writers_in_several_processes_share_one_run(empty_database: EmptyDatabase) -> None:
    spec = {'backend': empty_database.url.replace('+aiosqlite', '').replace('+asyncpg', '')}
    async with SqlStepStore(empty_database.url) as store:
        await store.register_run(RunRecord(run_id=RUN_ID))
    write_concurrently(spec, ['1', '2', '3'], count=12, script=SCRIPT)
    async with SqlStepStore(empty_database.url) as store:
        read = await store.list_snapshots(run_id=RUN_ID)
        assert sorted(s.step_index % 100 for s in read) == sorted(list(range(1, 13)) * 3)
        wrong = [s.step_index for s in read if dump(s.messages) != dump(history_for(s.step_index))]
        assert wrong == []


async def test_a_run_deleted_and_registered_again_elsewhere_is_not_confused_with_the_old_one(
    empty_database: EmptyDatabase,
) -> None:
    old, new = sample_history(2, tag='old'), sample_history(1, tag='new')
    async with SqlStepStore(empty_database.url) as writer, SqlStepStore(empty_database.url) as other:
        await writer.register_run(RunRecord(run_id='reused'))
        await writer.save_snapshot(snapshot('reused', old, 2, HistoryEncoder()))
        await other.delete_run(run_id='reused')
        await other.register_run(RunRecord(run_id='reused'))
        await other.save_snapshot(snapshot('reused', new, 1, HistoryEncoder()))
        extended = [*old, ModelRequest(parts=[UserPromptPart(content='and then')])]
        await writer.save_snapshot(snapshot('reused', extended, 3, HistoryEncoder()))
        assert [dump(s.messages) for s in await other.list_snapshots(run_id='reused')] == [dump(new), dump(extended)]


async def test_a_shared_connection_also_writes_each_message_once(empty_database: EmptyDatabase) -> None:
    history = sample_history(3, tag='conn')
    engine = create_async_engine(empty_database.url)
    try:
        async with engine.begin() as connection:
            store = SqlStepStore(connection)
            await store.register_run(RunRecord(run_id='conn'))
            for step in range(1, 4):
                await store.save_snapshot(snapshot('conn', history[: 2 * step + 1], step, HistoryEncoder()))
    finally:
        await engine.dispose()
    found = await stored(empty_database.url, 'conn')
    assert found.message_rows == len(history)
    assert found.references == [(3, 3), (5, 5), (7, 7)]


async def run_agent(store: SqlStepStore, run_id: str, steps: int) -> None:
    """A real agent run of `steps` tool-calling steps, then a final answer."""

    def respond(history: list[ModelMessage]) -> Any:
        step = turn_step(history)
        return calls(('lookup', {'n': step}, f'lookup-{step}')) if step < steps else text('done')

    agent = Agent(scripted(respond), capabilities=[StepPersistence(store=store, run_id=run_id)])

    @agent.tool_plain
    def lookup(n: int) -> str:
        return f'value {n}'

    await agent.run('look everything up', usage_limits=UsageLimits(request_limit=None))


async def test_snapshot_rows_keep_a_constant_size_as_a_real_agent_run_grows(empty_database: EmptyDatabase) -> None:
    async with SqlStepStore(empty_database.url) as store:
        await run_agent(store, 'short', 20)
        await run_agent(store, 'long', 80)
        latest = await store.latest_snapshot(run_id='long')
        assert latest is not None and len(latest.messages) == 2 * 80 + 2
    short, long = await stored(empty_database.url, 'short'), await stored(empty_database.url, 'long')
    assert len(long.snapshot_row_bytes) > 80
    assert max(long.snapshot_row_bytes) <= max(short.snapshot_row_bytes) + 8, 'only digits may grow'
    assert long.message_rows <= 3 * 80 + 5, 'a few rows per step: the new messages and the completed newest one'
    assert long.message_bytes / 80 <= 1.1 * short.message_bytes / 20, 'message bytes per step stay flat'


@pytest.mark.parametrize('media_store', [None, 'auto'])
async def test_a_snapshot_updates_the_run_row_once_and_its_line_once(
    empty_database: EmptyDatabase, media_store: Any
) -> None:
    """Allocating the sequence number is the one update of the run's row; taking the message numbers the one
    update of the line's (after the first save, which creates the line). On PostgreSQL each save is one
    statement (`flush_statement.py`: `WITH locked AS (SELECT ... FROM runs ... FOR NO KEY UPDATE), anchor AS
    (SELECT ... FOR KEY SHARE), ..., allocated AS (UPDATE runs ...), taken AS (UPDATE history_lines ...),
    branched AS (INSERT INTO history_lines ...) ...`), which holds each of those once."""
    engine = create_async_engine(empty_database.url)
    steps = 5
    history = sample_history(steps, tag='reserved')
    encoder = HistoryEncoder()
    try:
        async with SqlStepStore(engine, media_store=media_store) as store:
            await store.migrate()
            updates = statements_sent(engine, 'UPDATE runs')
            line_updates = statements_sent(engine, 'UPDATE history_lines')
            line_inserts = statements_sent(engine, 'INSERT INTO history_lines')
            combined = statements_sent(engine, 'WITH locked')
            combined_in_transactions = statements_sent(engine, 'WITH anchor')
            await store.register_run(RunRecord(run_id='reserved'))
            for step in range(1, steps + 1):
                await store.save_snapshot(snapshot('reserved', history[: 2 * step + 1], step, encoder))
            latest = await store.latest_snapshot(run_id='reserved')
    finally:
        await engine.dispose()
    assert latest is not None and dump(latest.messages) == dump(history)
    if empty_database.dialect == 'postgresql':
        # A save whose new messages hold media (its blob rows with them) takes a transaction, whose one statement
        # does the same (`WriteStatements.allocate_on_line`).
        in_transactions = 0 if media_store is None else 1
        assert (len(updates), len(line_inserts), len(line_updates)) == (0, 0, 0)
        assert (len(combined), len(combined_in_transactions)) == (steps - in_transactions, in_transactions)
        assert all(
            [flush.count(write) for write in ('UPDATE runs', 'UPDATE history_lines')] == [1, 1]
            for flush in combined + combined_in_transactions
        )
    else:
        assert (len(updates), len(combined), len(line_inserts), len(line_updates)) == (steps, 0, 1, steps - 1)
    found = await stored(empty_database.url, 'reserved')
    assert found.references == [(2 * step + 1, 2 * step + 1) for step in range(1, steps + 1)]


async def test_a_keyed_snapshot_claims_its_key_and_allocates_in_one_postgres_statement(
    postgres_database: EmptyDatabase,
) -> None:
    engine = create_async_engine(postgres_database.url)
    claims, combined = statements_sent(engine, 'INSERT INTO snapshot_keys'), statements_sent(engine, 'WITH claimed')
    flushes = statements_sent(engine, 'WITH locked')
    history = sample_history(2, tag='keyed')
    try:
        async with SqlStepStore(engine) as store:
            await store.register_run(RunRecord(run_id='keyed'))
            for step, key in ((1, 'a'), (2, 'a'), (2, 'b')):
                keyed = ContinuableSnapshot(run_id='keyed', step_index=step, messages=history, idempotency_key=key)
                await store.save_snapshot(keyed)
            saved = await store.list_snapshots(run_id='keyed')
            sent = (len(claims), len(combined), len(flushes))
            await store.save_snapshot(keyed.model_copy(update={'run_id': 'unknown'}))  # registered bare, then saved
            assert [s.idempotency_key for s in await store.list_snapshots(run_id='unknown')] == ['b']
    finally:
        await engine.dispose()
    assert [(s.seq, s.step_index, s.idempotency_key) for s in saved] == [(1, 1, 'a'), (2, 2, 'b')]
    # One statement claims the key and allocates the number: the first save's (its history holds media: a
    # transaction), then the repeated key's once more after a bare registration found the run stored. The
    # flush in one statement (`WITH locked ...`) claims the key too: it saves the third and writes nothing
    # for the repeated key, whose flush then takes the transaction.
    assert sent == (0, 3, 2)


async def test_a_chat_of_40_turns_stores_each_message_once_and_reads_no_message_to_go_on(
    empty_database: EmptyDatabase,
) -> None:
    """Each turn a new run (in a store that has nothing cached, as in a new process) continuing the previous
    turn's snapshot: the turn's rows go on the chat's one line, and its head comes from the origin's
    `history_digest` without reading a message row."""
    turns = 40
    engine = create_async_engine(empty_database.url)
    try:
        await SqlStepStore(engine).migrate()
        selects = statements_sent(engine, 'SELECT')
        for turn in range(turns):
            async with SqlStepStore(engine) as store:
                origin = None if turn == 0 else RunOrigin(kind='continued', run_id=f'turn-{turn - 1}', seq=1)
                await store.register_run(RunRecord(run_id=f'turn-{turn}', conversation_id='chat', origin=origin))
                history = chat_history(turn + 1)
                await store.save_snapshot(ContinuableSnapshot(run_id=f'turn-{turn}', step_index=1, messages=history))
        assert [statement for statement in selects if 'FROM messages' in statement] == []
        async with SqlStepStore(engine) as store:
            for turn in range(turns):
                latest = await store.latest_snapshot(run_id=f'turn-{turn}')
                assert latest is not None and dump(latest.messages) == dump(chat_history(turn + 1))
    finally:
        await engine.dispose()
    assert await count_rows(empty_database.url, messages) == 2 * turns
    assert await count_rows(empty_database.url, history_lines) == 1
    assert (await stored(empty_database.url, f'turn-{turns - 1}')).references == [(2 * turns, 2 * turns)]


async def test_a_second_tab_branches_with_only_its_own_messages(empty_database: EmptyDatabase) -> None:
    base = chat_history(3)
    tabs = {tab: base + chat_history(1, tag=f'-{tab}', start=3) for tab in ('tab-1', 'tab-2')}
    async with SqlStepStore(empty_database.url) as store:
        await store.register_run(RunRecord(run_id='head', conversation_id='chat'))
        await store.save_snapshot(ContinuableSnapshot(run_id='head', step_index=1, messages=base))
        for tab in tabs:
            await store.register_run(
                RunRecord(run_id=tab, conversation_id='chat', origin=RunOrigin(kind='continued', run_id='head', seq=1))
            )
        for tab, history in tabs.items():
            await store.save_snapshot(ContinuableSnapshot(run_id=tab, step_index=1, messages=history))
        for tab, history in tabs.items():
            latest = await store.latest_snapshot(run_id=tab)
            assert latest is not None and dump(latest.messages) == dump(history)
        assert (await store.get_run(run_id='tab-2')).origin == RunOrigin(kind='forked', run_id='head', seq=1)  # type: ignore[union-attr]
    head, first, second = [await stored(empty_database.url, run_id) for run_id in ('head', 'tab-1', 'tab-2')]
    assert head.lines == first.lines != second.lines, 'the first tab goes on the line, the second branches'
    assert (first.references, second.references) == ([(8, 8)], [(8, 2)])
    assert await count_rows(empty_database.url, messages) == 6 + 2 + 2
    engine = create_async_engine(empty_database.url)
    try:
        async with engine.connect() as connection:
            lines = (await connection.execute(select(history_lines).order_by(history_lines.c.id))).all()
    finally:
        await engine.dispose()
    [main_line] = head.lines
    assert [(line.base_line_id, line.base_length, line.base_through) for line in lines] == [
        (None, None, None),
        (main_line, 6, 6),
    ]


async def test_deleting_turns_of_a_chat_reclaims_their_own_rows_at_once(empty_database: EmptyDatabase) -> None:
    """The newest turn's rows go with it, the oldest turn's stay (later turns use them), and deleting the
    whole conversation leaves no row and no line, all without `collect_media`."""
    turns = 6
    async with SqlStepStore(empty_database.url) as store:
        for turn in range(turns):
            origin = None if turn == 0 else RunOrigin(kind='continued', run_id=f'turn-{turn - 1}', seq=1)
            await store.register_run(RunRecord(run_id=f'turn-{turn}', conversation_id='chat', origin=origin))
            history = chat_history(turn + 1)
            await store.save_snapshot(ContinuableSnapshot(run_id=f'turn-{turn}', step_index=1, messages=history))
        await store.delete_run(run_id=f'turn-{turns - 1}')
        assert await count_rows(empty_database.url, messages) == 2 * (turns - 1)
        await store.delete_run(run_id='turn-0')
        assert await count_rows(empty_database.url, messages) == 2 * (turns - 1)
        for turn in range(1, turns - 1):
            latest = await store.latest_snapshot(run_id=f'turn-{turn}')
            assert latest is not None and dump(latest.messages) == dump(chat_history(turn + 1))
        assert len(await delete_conversation(store, conversation_id='chat')) == turns - 2
    assert (await count_rows(empty_database.url, messages), await count_rows(empty_database.url, history_lines)) == (
        0,
        0,
    )
