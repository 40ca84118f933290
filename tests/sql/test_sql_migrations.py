"""The packaged Alembic migrations: the `alembic` command, the state-column upgrade, models vs. migrations."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelMessagesTypeAdapter, ModelResponse, TextPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from sqlalchemy import BigInteger, Boolean, Column, Integer, MetaData, String, Table, func, select, text
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import create_async_engine

from step_persistence import (
    ContinuableSnapshot,
    RunRecord,
    SqlStepStore,
    StepEvent,
    StepPersistence,
    TokenUsage,
    ToolEffectRecord,
    from_spec,
)
from step_persistence._history import encode_messages
from step_persistence.durable import StepDurability, journal_for
from step_persistence.media import SqlMediaStore
from step_persistence.records import ConversationSummary, RunOrigin, SnapshotRef
from step_persistence.reporting import summarize_runs
from step_persistence.stores._media import DEFAULT_THRESHOLD_BYTES, MessageMedia
from step_persistence.stores._positions import RunHead, plan_saves
from step_persistence.stores.sql import TABLE_NAMES, TABLES, VERSION_TABLE, include_name
from step_persistence.stores.sql.database import Database
from step_persistence.stores.sql.database_store import HEAD_REVISION, SchemaNotReadyError
from step_persistence.stores.sql.executors import Transaction
from step_persistence.stores.sql.migrate import downgrade, upgrade
from step_persistence.stores.sql.reporting import read_report
from step_persistence.stores.sql.schema import (
    events,
    history_lines,
    media,
    messages,
    runs,
    snapshot_keys,
    tool_effects,
)
from step_persistence.stores.sql.types import JSON_DOCUMENT, DateTimeUTC, EncodedJSON
from step_persistence.testing.conformance import T0, sample_history
from step_persistence.testing.conformance.conversations import chat_history
from support.databases import EmptyDatabase

pytestmark = pytest.mark.anyio
ROOT = Path(__file__).resolve().parents[2]
REPORTING_VIEWS = {'run_summary', 'tool_call_stats'}


def alembic(*args: str, env: dict[str, str] | None = None, succeed: bool = True) -> subprocess.CompletedProcess[str]:
    """Run the real `alembic` command from the repository root (where `alembic.ini` lives)."""
    completed = subprocess.run(
        [sys.executable, '-m', 'alembic', *args],
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (completed.returncode == 0) == succeed, completed.stderr
    return completed


def dump(history: list[ModelMessage]) -> Any:
    return ModelMessagesTypeAdapter.dump_python(history, mode='json')


def plain(url: str) -> str:
    """The URL as a user would write it, without the async driver."""
    return url.replace('+aiosqlite', '').replace('+asyncpg', '')


async def scalar(url: str, statement: Any) -> Any:
    engine = create_async_engine(url)
    try:
        async with engine.connect() as connection:
            return (await connection.execute(statement)).scalar_one()
    finally:
        await engine.dispose()


async def test_alembic_upgrade_head_and_downgrade_base(empty_database: EmptyDatabase) -> None:
    alembic('-x', f'url={plain(empty_database.url)}', 'upgrade', 'head')
    assert await empty_database.table_names() == TABLE_NAMES | {VERSION_TABLE}
    assert await empty_database.view_names() == REPORTING_VIEWS
    assert await scalar(empty_database.url, text(f'SELECT version_num FROM {VERSION_TABLE}')) == HEAD_REVISION

    alembic('downgrade', 'base', env={'STEP_PERSISTENCE_DATABASE_URL': plain(empty_database.url)})
    assert await empty_database.table_names() == {VERSION_TABLE}
    assert await empty_database.view_names() == set()


async def test_alembic_upgrade_into_a_postgres_schema(postgres_database: EmptyDatabase) -> None:
    alembic('-x', f'url={postgres_database.url}', '-x', 'schema=steps', 'upgrade', 'head')
    assert await postgres_database.table_names(schema='steps') == TABLE_NAMES | {VERSION_TABLE}
    assert await postgres_database.table_names() == set()
    async with SqlStepStore(postgres_database.url, schema='steps', auto_migrate=False) as store:
        await store.register_run(RunRecord(run_id='in-schema'))
        assert [run.run_id for run in await store.list_runs()] == ['in-schema']


def test_alembic_without_a_url_says_how_to_give_one() -> None:
    env = {'STEP_PERSISTENCE_DATABASE_URL': ''}
    completed = alembic('upgrade', 'head', env=env, succeed=False)
    assert '-x url=' in completed.stderr and 'STEP_PERSISTENCE_DATABASE_URL' in completed.stderr


def test_alembic_offline_mode_prints_the_sql(tmp_path: Path) -> None:
    completed = alembic('-x', f'url=sqlite:///{tmp_path / "never-created.db"}', 'upgrade', 'head', '--sql')
    assert 'CREATE TABLE runs' in completed.stdout
    assert "ADD COLUMN state VARCHAR DEFAULT 'complete' NOT NULL" in completed.stdout
    assert f"INSERT INTO {VERSION_TABLE} (version_num) VALUES ('0001')" in completed.stdout
    assert not (tmp_path / 'never-created.db').exists()


async def test_snapshots_from_before_the_state_column_read_back_complete(empty_database: EmptyDatabase) -> None:
    database = Database.from_url(empty_database.url)
    history = sample_history(2, tag='old')
    try:
        await upgrade(database, '0001')

        def write_old_rows(transaction: Transaction) -> None:
            connection = transaction.connection
            assert 'state' not in Table('snapshots', MetaData(), autoload_with=connection).c
            connection.execute(
                OLD_RUNS.insert().values(
                    run_id='old',
                    metadata={},
                    started_at=T0,
                    last_snapshot_seq=2,
                    last_message_no=len(history),
                )
            )
            encoded = encode_messages(history)
            connection.execute(
                OLD_MESSAGES.insert(),
                [
                    {
                        'run_id': 'old',
                        'no': position + 1,
                        'position': position,
                        'digest': message.digest,
                        'body': message.data,
                        'externalized': False,
                    }
                    for position, message in enumerate(encoded)
                ],
            )
            for seq, length in ((1, 3), (2, len(history))):
                connection.execute(
                    OLD_SNAPSHOTS.insert().values(
                        run_id='old',
                        seq=seq,
                        step_index=seq,
                        timestamp=T0,
                        history_length=length,
                        through_message=length,
                    )
                )

        await database.run(write_old_rows, write=True)
        await upgrade(database)
    finally:
        await database.aclose()

    async with SqlStepStore(empty_database.url) as store:
        latest = await store.latest_snapshot(run_id='old')
        assert latest is not None
        assert (latest.seq, latest.state) == (2, 'complete')
        assert dump(latest.messages) == dump(history)
        assert [s.state for s in await store.list_snapshots(run_id='old')] == ['complete', 'complete']
        await store.save_snapshot(
            ContinuableSnapshot(run_id='old', step_index=3, messages=history, state='interrupted')
        )
        newest = await store.latest_snapshot(run_id='old', include_interrupted=True)
        assert newest is not None and (newest.seq, newest.state) == (3, 'interrupted')


def _differences(connection: Connection, metadata: MetaData, **options: Any) -> list[Any]:
    context = MigrationContext.configure(
        connection,
        opts={'compare_type': True, 'compare_server_default': True, 'version_table': VERSION_TABLE, **options},
    )
    return list(compare_metadata(context, metadata))


async def test_migrations_and_models_agree(empty_database: EmptyDatabase) -> None:
    async with SqlStepStore(empty_database.url) as store:
        await store.migrate()
    engine = create_async_engine(empty_database.url)
    try:
        async with engine.connect() as connection:
            assert await connection.run_sync(_differences, TABLES) == []
    finally:
        await engine.dispose()


async def test_an_applications_autogenerate_ignores_our_tables(empty_database: EmptyDatabase) -> None:
    app = MetaData()
    Table('orders', app, Column('id', Integer, primary_key=True))
    engine = create_async_engine(empty_database.url)
    try:
        async with engine.begin() as connection:
            await connection.run_sync(app.create_all)
        async with SqlStepStore(engine) as store:
            await store.migrate()
        async with engine.connect() as connection:
            assert await connection.run_sync(_differences, app, include_name=include_name) == []
            unfiltered = await connection.run_sync(_differences, app)
        assert {diff[1].name for diff in unfiltered if diff[0] == 'remove_table'} == set(TABLE_NAMES)
    finally:
        await engine.dispose()


async def test_stores_starting_together_in_several_processes_migrate_once(postgres_database: EmptyDatabase) -> None:
    from support.processes import write_concurrently

    spec = {'backend': postgres_database.url, 'schema': 'concurrent'}
    write_concurrently(spec, [f'p{number}' for number in range(3)], count=2)
    async with from_spec(**spec) as store:
        assert len(await store.list_runs()) == 6
        for run in await store.list_runs():
            assert len(await store.list_snapshots(run_id=run.run_id)) == 2
    version = text(f'SELECT count(*) FROM concurrent.{VERSION_TABLE}')
    assert await scalar(postgres_database.url, version) == 1
    assert await postgres_database.table_names(schema='concurrent') == TABLE_NAMES | {VERSION_TABLE}


async def test_upgrading_a_current_database_changes_nothing(empty_database: EmptyDatabase) -> None:
    async with SqlStepStore(empty_database.url) as store:
        await store.register_run(RunRecord(run_id='kept'))
    async with SqlStepStore(empty_database.url) as store:
        await store.migrate()
        assert [run.run_id for run in await store.list_runs()] == ['kept']
    assert await scalar(empty_database.url, select(func.count()).select_from(runs)) == 1


# --- revision 0005: a database written by the code of revision 0004 ---

_OLD = MetaData()
OLD_RUNS = Table(
    'runs',
    _OLD,
    Column('run_id', String),
    Column('conversation_id', String),
    Column('parent_run_id', String),
    Column('agent_name', String),
    Column('metadata', JSON_DOCUMENT),
    Column('started_at', DateTimeUTC()),
    Column('last_snapshot_seq', BigInteger),
    Column('last_message_no', BigInteger),
)
OLD_MESSAGES = Table(
    'messages',
    _OLD,
    Column('run_id', String),
    Column('no', BigInteger),
    Column('position', Integer),
    Column('digest', String),
    Column('body', EncodedJSON()),
    Column('externalized', Boolean),
)
OLD_SNAPSHOTS = Table(
    'snapshots',
    _OLD,
    *(Column(name, String) for name in ('run_id', 'conversation_id', 'parent_run_id', 'agent_name', 'idempotency_key')),
    Column('seq', BigInteger),
    Column('step_index', Integer),
    Column('timestamp', DateTimeUTC()),
    Column('history_length', Integer),
    Column('through_message', BigInteger),
    Column('state', String),
)
"""The tables revision 0004 left that revision 0005 changes, as the code of 0004 wrote them."""
SNAPSHOT_FIELDS = ('run_id', 'seq', 'step_index', 'timestamp', 'conversation_id', 'parent_run_id', 'agent_name')
SNAPSHOT_FIELDS += ('idempotency_key', 'state')

MINUTE = timedelta(minutes=1)


def _old_histories() -> dict[str, list[ContinuableSnapshot]]:
    """The snapshots of the old database, per run (seq set; a gap where retention pruned one)."""
    base = sample_history(3, tag='alpha')
    completed = dataclasses.replace(base[2], run_id='completed later')  # a second version of position 2
    alpha = [
        (1, 'complete', base[:3], 'sk-1'),
        (2, 'interrupted', [*base[:2], completed, *base[3:5]], None),
        (3, 'complete', [*base[:2], completed, *base[3:7]], None),
    ]
    beta = [(2, 'complete', sample_history(2, tag='beta'), None)]
    runs = {'alpha': alpha, 'beta': beta}
    return {
        run_id: [
            ContinuableSnapshot(
                run_id=run_id,
                seq=seq,
                step_index=seq * 10,
                state=state,  # type: ignore[arg-type]
                messages=history,
                conversation_id='c1',
                agent_name='writer',
                idempotency_key=key,
                timestamp=T0 + seq * MINUTE,
            )
            for seq, state, history, key in snapshots
        ]
        for run_id, snapshots in runs.items()
    }


OLD_RUN_RECORDS = [
    RunRecord(run_id='alpha', conversation_id='c1', agent_name='writer', metadata={'team': 'a'}, started_at=T0),
    RunRecord(run_id='beta', conversation_id='c1', agent_name='writer', parent_run_id='alpha', started_at=T0 + MINUTE),
    RunRecord(run_id='gamma', parent_run_id='alpha', started_at=T0 + 2 * MINUTE),
]
OLD_EVENTS = [
    StepEvent(run_id='alpha', kind='run_started', step_index=0, timestamp=T0, idempotency_key='ev-1'),
    StepEvent(run_id='alpha', kind='tool_call_failed', step_index=1, timestamp=T0, error="ValueError('x')"),
    StepEvent(run_id='gamma', kind='run_started', step_index=0, timestamp=T0, metadata={'k': 'v'}),
]
OLD_EFFECTS = [
    ToolEffectRecord(run_id='gamma', tool_call_id='t1', tool_name='send', status='started', started_at=T0),
    ToolEffectRecord(
        run_id='alpha',
        tool_call_id='t2',
        tool_name='pay',
        status='completed',
        started_at=T0,
        ended_at=T0 + MINUTE,
        idempotency_key='pay-1',
        effect_summary='paid',
    ),
]


async def _write_0004_database(url: str) -> None:
    """A database at revision 0004 holding `OLD_*` and `_old_histories()`, each run's messages numbered on its own
    (a row per changed position, media in the `media` table) as that revision's code wrote them."""
    database = Database.from_url(url)
    try:
        await upgrade(database, '0004')
    finally:
        await database.aclose()
    histories = _old_histories()
    media = MessageMedia(store=SqlMediaStore(url, auto_migrate=False), threshold_bytes=DEFAULT_THRESHOLD_BYTES)
    message_rows: list[dict[str, Any]] = []
    snapshot_rows: list[dict[str, Any]] = []
    counters: dict[str, int] = {}
    for run_id, snapshots_of_run in histories.items():
        head = RunHead(incarnation=None)
        for snapshot in snapshots_of_run:
            encoded = snapshot.encoded_messages()
            plan = plan_saves(head, [[message.digest for message in encoded]])
            for row in plan.rows:
                packed = await media.pack_message(encoded[row.position])
                message_rows.append(
                    {
                        'run_id': run_id,
                        'no': row.no,
                        'position': row.position,
                        'digest': row.digest,
                        'body': packed.data,
                        'externalized': packed.externalized,
                    }
                )
            head = RunHead(incarnation=None, last_no=plan.throughs[0], latest=[m.digest for m in encoded])
            values = {name: getattr(snapshot, name) for name in SNAPSHOT_FIELDS}
            snapshot_rows.append({**values, 'history_length': len(encoded), 'through_message': plan.throughs[0]})
        counters[run_id] = head.last_no
    await media.store.aclose()  # type: ignore[union-attr]
    engine = create_async_engine(url)
    try:
        async with engine.begin() as connection:
            for record in OLD_RUN_RECORDS:
                values = record.model_dump(exclude={'origin'})
                last_seq = max((s.seq or 0 for s in histories.get(record.run_id, [])), default=0)
                counters_of_run = {'last_snapshot_seq': last_seq, 'last_message_no': counters.get(record.run_id, 0)}
                await connection.execute(OLD_RUNS.insert().values(**values, **counters_of_run))
            await connection.execute(OLD_MESSAGES.insert(), message_rows)
            await connection.execute(OLD_SNAPSHOTS.insert(), snapshot_rows)
            await connection.execute(snapshot_keys.insert().values(run_id='alpha', idempotency_key='sk-1'))
            for event_ in OLD_EVENTS:
                await connection.execute(events.insert().values(**_as_written_before_0006(event_)))
            for effect in OLD_EFFECTS:
                await connection.execute(tool_effects.insert().values(**effect.model_dump()))
    finally:
        await engine.dispose()


def _as_written_before_0006(event: StepEvent) -> dict[str, Any]:
    """The `events` row of an event without usage, in the columns the tables had before revision 0006."""
    assert event.model_name is None and event.usage is None
    return event.model_dump(exclude={'model_name', 'usage'})


def _header(snapshot: ContinuableSnapshot) -> dict[str, Any]:
    return snapshot.model_dump(exclude={'messages'})


async def _assert_reads_as_written(store: SqlStepStore, histories: dict[str, list[ContinuableSnapshot]]) -> None:
    """Each run's first snapshots are `histories`, exactly."""
    for run_id, expected in histories.items():
        stored = (await store.list_snapshots(run_id=run_id, include_interrupted=True))[: len(expected)]
        assert [_header(snapshot) for snapshot in stored] == [_header(snapshot) for snapshot in expected], run_id
        assert [dump(snapshot.messages) for snapshot in stored] == [dump(snapshot.messages) for snapshot in expected]


async def _count(url: str, table: Table) -> int:
    return int(await scalar(url, select(func.count()).select_from(table)))


async def test_a_database_written_at_0004_upgrades_and_reads_back_unchanged(empty_database: EmptyDatabase) -> None:
    url = empty_database.url
    await _write_0004_database(url)
    histories = _old_histories()
    async with SqlStepStore(url) as store:
        await store.migrate()  # reading never migrates: the deployment's upgrade
        assert await store.list_runs() == OLD_RUN_RECORDS
        await _assert_reads_as_written(store, histories)
        assert [await store.list_events(run_id=run.run_id) for run in OLD_RUN_RECORDS] == [
            [OLD_EVENTS[0], OLD_EVENTS[1]],
            [],
            [OLD_EVENTS[2]],
        ]
        assert await store.list_tool_effects(run_id='alpha') == [OLD_EFFECTS[1]]
        assert await store.list_unresolved_tool_effects(run_id='gamma') == [OLD_EFFECTS[0]]
        assert await store.list_conversations() == [
            ConversationSummary(
                conversation_id='c1',
                first_started_at=T0,
                last_started_at=T0 + MINUTE,
                run_count=2,
                head_run_id='beta',
            )
        ]
        latest = await store.latest_snapshot(run_id='alpha')
        assert latest is not None and latest.seq == 3
        assert await store.find_snapshot(conversation_id='c1', history_digest=latest.history_digest()) is None, (
            'snapshots saved before 0005 have no history digest'
        )
        old_keyed = histories['alpha'][0].model_copy(update={'seq': None, 'step_index': 99})
        await store.save_snapshot(old_keyed)  # the key the old code claimed is still claimed
        assert len(await store.list_snapshots(run_id='alpha', include_interrupted=True)) == 3
    assert await _count(url, history_lines) == 2, 'a line per run with snapshots'
    rows_before = await _count(url, messages)
    assert await _count(url, media) >= 1

    # New turns go on: a continuation shares the old run's line and stores only what it adds.
    continued = [*latest.messages, *chat_history(1, tag='-next', start=9)]
    async with SqlStepStore(url) as store:
        origin = RunOrigin(kind='continued', run_id='alpha', seq=3)
        await store.register_run(RunRecord(run_id='delta', conversation_id='c1', origin=origin))
        await store.save_snapshot(
            ContinuableSnapshot(run_id='delta', step_index=1, messages=continued, conversation_id='c1')
        )
        assert await _count(url, messages) == rows_before + 2
        assert await _count(url, history_lines) == 2
        going_on = [*latest.messages, *chat_history(1, tag='-alpha', start=9)]
        await store.save_snapshot(ContinuableSnapshot(run_id='alpha', step_index=40, messages=going_on))
        assert await _count(url, messages) == rows_before + 4, 'the old run branches with only its new messages'
        await store.delete_run(run_id='beta')
        await store.collect_media(grace=timedelta(0))
        [*_, newest] = await store.list_snapshots(run_id='alpha', include_interrupted=True)
        assert (newest.seq, dump(newest.messages)) == (4, dump(going_on))
        await _assert_reads_as_written(store, {'alpha': histories['alpha']})
        latest_delta = await store.latest_snapshot(run_id='delta')
        assert latest_delta is not None and dump(latest_delta.messages) == dump(continued)
        digest = latest_delta.history_digest()
        found = await store.find_snapshot(conversation_id='c1', history_digest=digest)
        assert found == SnapshotRef(run_id='delta', seq=1)
        assert [summary.head_run_id for summary in await store.list_conversations()] == ['delta']


async def test_a_database_downgraded_to_0004_reads_back_each_run_on_its_own(empty_database: EmptyDatabase) -> None:
    """Histories shared across runs (a continuation, a fork on a branch) are numbered per run again by the
    downgrade, and read back unchanged after upgrading once more."""
    url = empty_database.url
    await _write_0004_database(url)
    async with SqlStepStore(url) as store:
        await store.migrate()
        alpha = await store.latest_snapshot(run_id='alpha')
        assert alpha is not None
        await store.register_run(
            RunRecord(run_id='delta', conversation_id='c1', origin=RunOrigin(kind='continued', run_id='alpha', seq=3))
        )
        await store.save_snapshot(
            ContinuableSnapshot(run_id='delta', step_index=1, messages=[*alpha.messages, *chat_history(1, start=9)])
        )
        await store.register_run(
            RunRecord(run_id='fork', conversation_id='c1', origin=RunOrigin(kind='forked', run_id='alpha', seq=1))
        )
        first = (await store.list_snapshots(run_id='alpha'))[0]
        await store.save_snapshot(
            ContinuableSnapshot(run_id='fork', step_index=1, messages=[*first.messages, *chat_history(2, tag='-f')])
        )
        runs_before = await store.list_runs()
        saved = {
            run.run_id: await store.list_snapshots(run_id=run.run_id, include_interrupted=True) for run in runs_before
        }
    assert await _count(url, history_lines) == 3, 'the fork is on a branch'
    database = Database.from_url(url)
    try:
        await downgrade(database, '0004')
    finally:
        await database.aclose()
    engine = create_async_engine(url)
    try:
        async with engine.connect() as connection:
            for run_id, snapshots_of_run in saved.items():
                for snapshot in snapshots_of_run:
                    digests = (
                        await connection.execute(
                            text(
                                'SELECT m.digest FROM snapshots s JOIN messages m ON m.run_id = s.run_id '
                                'AND m.position < s.history_length WHERE s.run_id = :run AND s.seq = :seq '
                                'AND m.no = (SELECT max(v.no) FROM messages v WHERE v.run_id = m.run_id '
                                'AND v.position = m.position AND v.no <= s.through_message) ORDER BY m.position'
                            ),
                            {'run': run_id, 'seq': snapshot.seq},
                        )
                    ).scalars()
                    assert list(digests) == [message.digest for message in snapshot.encoded_messages()]
    finally:
        await engine.dispose()
    async with SqlStepStore(url) as store:
        await store.migrate()  # upgrades again
        assert await store.list_runs() == [run.model_copy(update={'origin': None}) for run in runs_before]
        for run_id, snapshots_of_run in saved.items():
            assert [dump(s.messages) for s in await store.list_snapshots(run_id=run_id, include_interrupted=True)] == [
                dump(s.messages) for s in snapshots_of_run
            ]


# --- revision 0006: token usage on events, totals in run_summary ---

USAGE = TokenUsage(input_tokens=120, output_tokens=30, cache_read_tokens=100, cache_write_tokens=4)
TOTALS = ('input_tokens', 'output_tokens', 'cache_read_tokens', 'cache_write_tokens')


async def _view_columns(url: str) -> list[str]:
    engine = create_async_engine(url)
    try:
        async with engine.connect() as connection:
            return list((await connection.execute(text('SELECT * FROM run_summary'))).keys())
    finally:
        await engine.dispose()


async def test_events_written_at_0005_read_back_without_usage_and_the_totals_come_with_0006(
    empty_database: EmptyDatabase,
) -> None:
    url = empty_database.url
    database = Database.from_url(url)
    try:
        await upgrade(database, '0005')
    finally:
        await database.aclose()
    old_events = [
        StepEvent(run_id='old', kind='run_started', step_index=0, timestamp=T0),
        StepEvent(run_id='old', kind='model_request_started', step_index=1, timestamp=T0),
        StepEvent(run_id='old', kind='model_request_completed', step_index=1, timestamp=T0, idempotency_key='m1'),
    ]
    engine = create_async_engine(url)
    try:
        async with engine.begin() as connection:  # as the code of 0005 wrote them
            await connection.execute(runs.insert().values(run_id='old', metadata={}, started_at=T0))
            for event in old_events:
                await connection.execute(events.insert().values(**_as_written_before_0006(event)))
    finally:
        await engine.dispose()
    at_0005 = await _view_columns(url)
    assert not set(TOTALS) & set(at_0005)

    new = StepEvent(run_id='old', kind='model_request_completed', step_index=2, model_name='m', usage=USAGE)
    async with SqlStepStore(url) as store:
        await store.migrate()
        assert await store.list_events(run_id='old') == old_events
        [summary], _ = await read_report(store)
        assert [getattr(summary, name) for name in TOTALS] == [0, 0, 0, 0]
        assert summary.model_requests == 1
        await store.append_event(new)
        assert (await store.list_events(run_id='old'))[-1] == new
        expected = await summarize_runs(store)
        assert await read_report(store) == (expected, [])
        assert [getattr(expected[0], name) for name in TOTALS] == [120, 30, 100, 4]
    assert await _view_columns(url) == [*at_0005, *TOTALS], 'the totals come after the columns of 0003'

    database = Database.from_url(url)
    try:
        await downgrade(database, '0005')
    finally:
        await database.aclose()
    assert await _view_columns(url) == at_0005
    assert await empty_database.view_names() == REPORTING_VIEWS
    async with SqlStepStore(url) as store:
        await store.migrate()  # upgrades again: the usage went with its columns, the event stays
        without_usage = new.model_copy(update={'model_name': None, 'usage': None})
        assert await store.list_events(run_id='old') == [*old_events, without_usage]
        [summary], _ = await read_report(store)
        assert [getattr(summary, name) for name in TOTALS] == [0, 0, 0, 0]


# --- revision 0007: runs registered by a write (bare) ---


async def _runs_columns(url: str) -> dict[str, bool]:
    """`run_id -> bare` of every row of `runs` (a run without the column: `False`)."""
    engine = create_async_engine(url)
    try:
        async with engine.connect() as connection:
            found = await connection.run_sync(lambda sync: Table('runs', MetaData(), autoload_with=sync).c)
            bare = found.get('bare')
            selected = select(found['run_id'], text('0') if bare is None else bare)
            return {run_id: bool(flag) for run_id, flag in await connection.execute(selected)}
    finally:
        await engine.dispose()


async def test_runs_registered_at_0006_stay_registered_and_a_bare_run_outlives_the_downgrade(
    empty_database: EmptyDatabase,
) -> None:
    url = empty_database.url
    database = Database.from_url(url)
    try:
        await upgrade(database, '0006')
    finally:
        await database.aclose()
    engine = create_async_engine(url)
    try:
        async with engine.begin() as connection:  # as the code of 0006 registered it
            await connection.execute(runs.insert().values(run_id='old', metadata={}, started_at=T0))
    finally:
        await engine.dispose()

    written = StepEvent(run_id='written', kind='run_started', step_index=0, timestamp=T0)
    async with SqlStepStore(url) as store:
        await store.migrate()
        with pytest.raises(ValueError, match='old'):
            await store.register_run(RunRecord(run_id='old', agent_name='again'))
        await store.append_event(written)
        assert await store.get_run(run_id='written') == RunRecord(run_id='written', started_at=T0)
    assert await _runs_columns(url) == {'old': False, 'written': True}

    database = Database.from_url(url)
    try:
        await downgrade(database, '0006')
    finally:
        await database.aclose()
    assert await _runs_columns(url) == {'old': False, 'written': False}
    async with SqlStepStore(url) as store:
        await store.migrate()  # upgrades again: the bare run is now one registered with its id alone
        assert await store.get_run(run_id='written') == RunRecord(run_id='written', started_at=T0)
        assert await store.list_events(run_id='written') == [written]
        with pytest.raises(ValueError, match='written'):
            await store.register_run(RunRecord(run_id='written', agent_name='late'))


# --- revision 0008: the durable journal ---


async def test_a_journal_on_a_database_at_0007_not_migrated_names_the_revision_and_the_upgrade(
    empty_database: EmptyDatabase,
) -> None:
    database = Database.from_url(empty_database.url)
    try:
        await upgrade(database, '0007')
    finally:
        await database.aclose()

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        return ModelResponse(parts=[TextPart('done')])

    async with SqlStepStore(empty_database.url, auto_migrate=False) as store:
        agent = Agent(FunctionModel(model), name='orders', capabilities=[StepPersistence(store), StepDurability(store)])
        with pytest.raises(SchemaNotReadyError, match=r'revision 0007, older than 0008.*step-persistence db upgrade'):
            await agent.run('Charge order 42', run_id='order-42')
        with pytest.raises(SchemaNotReadyError, match='revision 0007') as raised:
            await journal_for(store).get_workflow(workflow_id='order-42')
        assert (raised.value.revision, raised.value.upgradable) == ('0007', True)
        assert 'auto_migrate=False' in str(raised.value)
        await store.migrate()
        assert (await agent.run('Charge order 42', run_id='order-42')).output == 'done'
