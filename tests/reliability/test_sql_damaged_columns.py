"""Raw SQL damage to one row of one column, for every column of every table, on SQLite and PostgreSQL.

Values the store never writes go in with plain `UPDATE` statements: text that is not JSON or not an
instant, numbers and blobs where text belongs, text where numbers belong, NULLs where the database
lets them in, and on PostgreSQL (whose columns are typed) infinite instants, instants outside
Python's years 1 to 9999, JSON of the wrong shape and JSON nested deeper than Python decodes.
Whatever the damage (issue 16, items 3 and 6):

- every read of the protocol still works, on the damaged run and on every other: a damaged row is
  skipped and logged, never fatal to the listing it is in, and the run's other rows are returned
  exactly as written (`get_run` and `get_tool_effect` return a record or `None`);
- reading never writes;
- the reporting views still give the healthy runs' summaries;
- a later save to the damaged run either stores a snapshot that reads back exactly, or is refused
  with an error of the store (never a `MemoryError` or a stray `TypeError`), and a reader never
  gets a snapshot whose messages differ from what was saved;
- a sentinel run in the same database reads back unchanged.

One damage is one `UPDATE` of one row (the victim run's newest event, newest message row, newest
snapshot, its completed tool effect, its own media blob, its run row, its snapshot key); a value
the database refuses (a constraint, a type) is not a damage anyone can do, and is counted as such.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest
from pydantic_ai.messages import BinaryContent, ModelMessage, ModelRequest, UserPromptPart
from sqlalchemy import Boolean, Integer, LargeBinary, String, text
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from step_persistence import ContinuableSnapshot, RunRecord, SqlStepStore, StepEvent, ToolEffectRecord
from step_persistence.durable import journal_for
from step_persistence.durable.records import DurableUnit, WorkflowRecord
from step_persistence.stores.sql.reporting import read_report
from step_persistence.stores.sql.schema import TABLES
from step_persistence.stores.sql.types import DateTimeUTC, EncodedJSON
from step_persistence.testing.conformance import T0, sample_history
from support.crash_ledger import fingerprint
from support.databases import EmptyDatabase
from support.reliability_helpers import write_sentinel

pytestmark = pytest.mark.anyio

DEEP_JSON = "'" + '[' * 3000 + ']' * 3000 + "'"
"""Valid JSON nested deeper than Python's `json` module decodes (it raises `RecursionError`)."""

NOT_UTF8 = "CAST(X'C3' AS TEXT)"
"""Text that is not UTF-8 (half a character): Python's `sqlite3` refuses to decode it, for a whole query."""

SQLITE_VALUES: dict[str, list[str]] = {
    'text': ['5', "X'00FF'", NOT_UTF8],
    'int': ['NULL', "'x'", '2.5', '-1', '9223372036854775807'],
    'bool': ["'x'", '2'],
    'instant': ["'tomorrow'", '5', "X'00FF'", NOT_UTF8],
    'json': ["'not json'", "'[1]'", "X'00FF'", NOT_UTF8, DEEP_JSON],
    'body': ["'not json'", "'null'", "X'00FF'", NOT_UTF8, DEEP_JSON],
    'bytes': ["'text'", "X''"],
}
"""SQLite stores any value in any column (only NOT NULL, keys and `INTEGER PRIMARY KEY` refuse some)."""

POSTGRES_VALUES: dict[str, list[str]] = {
    'text': ["''"],
    'int': ['-1', '2147483647', '9223372036854775807'],
    'bool': ['NULL'],
    'instant': ["'infinity'", "'-infinity'", "'10000-01-01 00:00:00+00'", "'0044-03-15 00:00:00+00 BC'"],
    'json': ["'[1]'", '\'"s"\'', "'null'", DEEP_JSON],
    'body': ["'[1]'", "'null'", DEEP_JSON],
    'bytes': ["''"],
}
"""PostgreSQL's columns are typed: what they admit that the store never writes (NULL: only where NOT NULL
is missing, which it is nowhere but in the nullable columns)."""

_VICTIM_LINE = '(SELECT line_id FROM snapshots WHERE run_id = :run AND seq = 1)'
TARGETS: dict[str, str] = {
    'runs': 'run_id = :run',
    'conversations': "conversation_id = 'conversation-' || :run",
    'events': 'id = (SELECT max(id) FROM events WHERE run_id = :run)',
    'history_lines': f'id = {_VICTIM_LINE}',
    'messages': f'line_id = {_VICTIM_LINE} AND no = (SELECT max(no) FROM messages WHERE line_id = {_VICTIM_LINE})',
    'snapshots': 'run_id = :run AND seq = (SELECT max(seq) FROM snapshots WHERE run_id = :run)',
    'snapshot_keys': 'run_id = :run',
    'tool_effects': "run_id = :run AND tool_call_id = 'b'",
    'media': 'digest = :digest',
    'durable_workflows': 'workflow_id = :run',
    'durable_units': "workflow_id = :run AND unit_key = 'u2'",
}
"""The one row of each table a damage changes (the victim's line: the one its snapshots are on)."""


def kind_of(column: Any) -> str:
    column_type = column.type
    if isinstance(column_type, DateTimeUTC):
        return 'instant'
    if isinstance(column_type, EncodedJSON):
        return 'body'
    if isinstance(column_type, Boolean):
        return 'bool'
    if isinstance(column_type, Integer):
        return 'int'
    if isinstance(column_type, LargeBinary):
        return 'bytes'
    if isinstance(column_type, String):
        return 'text'
    return 'json'


@dataclass(frozen=True)
class Damage:
    table: str
    column: str
    value: str

    def __str__(self) -> str:
        shown = self.value if len(self.value) < 40 else f'{self.value[:12]}...({len(self.value)} characters)'
        return f'{self.table}.{self.column} = {shown}'

    def statement(self) -> str:
        return f'UPDATE {self.table} SET {self.column} = {self.value} WHERE {TARGETS[self.table]}'


def damages(dialect: str) -> list[Damage]:
    values = SQLITE_VALUES if dialect == 'sqlite' else POSTGRES_VALUES
    found = [
        Damage(table.name, column.name, value)
        for table in TABLES.sorted_tables
        for column in table.columns
        for value in values[kind_of(column)]
        # SQLite's AUTOINCREMENT refuses to go past the largest key: no run could be registered after it.
        if not (dialect == 'sqlite' and column.name == 'id' and value == '9223372036854775807')
    ]
    assert {damage.table for damage in found} == set(TARGETS)
    return found


class Logged(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def image_of(run_id: str) -> bytes:
    """A payload of the victim's own (one media row no other run uses)."""
    return hashlib.sha256(run_id.encode()).digest() * 64


def history(run_id: str, step: int) -> list[ModelMessage]:
    messages = sample_history(step, tag=run_id)
    if step >= 3:
        own = BinaryContent(data=image_of(run_id), media_type='image/png')
        messages.append(ModelRequest(parts=[UserPromptPart(content=['look', own], timestamp=T0)]))
    return messages


async def write_victim(store: SqlStepStore, run_id: str) -> None:
    record = RunRecord(
        run_id=run_id,
        conversation_id=f'conversation-{run_id}',
        parent_run_id='orchestrator',
        agent_name='victim',
        metadata={'role': 'victim'},
        started_at=T0,
    )
    await store.register_run(record)
    await store.append_event(StepEvent(run_id=run_id, kind='run_started', step_index=0, idempotency_key='k0'))
    await store.append_event(
        StepEvent(run_id=run_id, kind='tool_call_started', step_index=1, tool_call_id='a', tool_name='t')
    )
    await store.append_event(
        StepEvent(run_id=run_id, kind='run_failed', step_index=2, error='boom', metadata={'n': '2'})
    )
    for step in (1, 2, 3):
        await store.save_snapshot(
            ContinuableSnapshot(
                run_id=run_id,
                step_index=step,
                messages=history(run_id, step),
                state='interrupted' if step == 2 else 'complete',
                idempotency_key='s1' if step == 1 else None,
            )
        )
    await store.record_tool_effect(ToolEffectRecord(run_id=run_id, tool_call_id='a', tool_name='t', status='started'))
    await store.record_tool_effect(
        ToolEffectRecord(
            run_id=run_id,
            tool_call_id='b',
            tool_name='t',
            status='completed',
            started_at=T0,
            ended_at=T0 + timedelta(seconds=1),
            idempotency_key='pay-b',
            effect_summary='paid',
        )
    )
    journal = journal_for(store)
    await journal.start_workflow(
        WorkflowRecord(workflow_id=run_id, code_version='v1', inputs={'prompt': 'p'}, created_at=T0, updated_at=T0)
    )
    for key in ('u1', 'u2'):
        unit = DurableUnit(workflow_id=run_id, unit_key=key, name='n', kind='tool', status='started', started_at=T0)
        await journal.record_unit(unit)
        await journal.record_unit(unit.model_copy(update={'status': 'completed', 'result': {'k': key}, 'ended_at': T0}))


async def observe(store: SqlStepStore, run_id: str) -> dict[str, Any]:
    """Every read of the protocol on the run; none may raise."""
    snapshots = await store.list_snapshots(run_id=run_id, include_interrupted=True)
    latest = await store.latest_snapshot(run_id=run_id)
    return {
        'runs': [run.run_id for run in await store.list_runs()],
        'conversations': [summary.conversation_id for summary in await store.list_conversations()],
        'by conversation': await store.list_runs(conversation_id=f'conversation-{run_id}'),
        'by parent': [run.run_id for run in await store.list_runs(parent_run_id='orchestrator')],
        'started before': [run.run_id for run in await store.runs_started_before(T0 + timedelta(days=365))],
        'run': await store.get_run(run_id=run_id),
        'events': await store.list_events(run_id=run_id),
        'snapshots': [(s.seq, s.step_index, s.state, fingerprint(s.messages)) for s in snapshots],
        'complete': [s.seq for s in await store.list_snapshots(run_id=run_id)],
        'snapshot states': await store.list_snapshot_states(run_id=run_id),
        'latest': None if latest is None else (latest.seq, fingerprint(latest.messages)),
        'latest of any state': await latest_seq(store, run_id),
        'effects': await store.list_tool_effects(run_id=run_id),
        'unresolved': [effect.tool_call_id for effect in await store.list_unresolved_tool_effects(run_id=run_id)],
        'effect a': await store.get_tool_effect(run_id=run_id, tool_call_id='a'),
        'effect b': await store.get_tool_effect(run_id=run_id, tool_call_id='b'),
        'workflow': await journal_for(store).get_workflow(workflow_id=run_id),
        'units': await journal_for(store).list_units(workflow_id=run_id),
    }


async def latest_seq(store: SqlStepStore, run_id: str) -> int | None:
    latest = await store.latest_snapshot(run_id=run_id, include_interrupted=True)
    return None if latest is None else latest.seq


async def table_contents(engine: AsyncEngine) -> list[Any]:
    """Every row of every table, as text (to tell that reading wrote nothing)."""
    found: list[Any] = []
    async with engine.connect() as connection:
        for table in TABLES.sorted_tables:
            if engine.dialect.name == 'sqlite':  # as bytes: a text may not be UTF-8
                columns = ', '.join(f'CAST({column.name} AS BLOB)' for column in table.columns)
            else:  # as text: a timestamp outside Python's years does not decode
                columns = ', '.join(f'CAST({column.name} AS TEXT)' for column in table.columns)
            rows = await connection.execute(text(f'SELECT {columns} FROM {table.name}'))
            found.append(sorted(tuple(map(repr, row)) for row in rows))
    return found


def untouched(contents: list[Any]) -> list[Any]:
    """`table_contents` without the media rows' `touched_at` (what a save refreshes before it writes)."""
    tables = TABLES.sorted_tables
    media_table = next(index for index, table in enumerate(tables) if table.name == 'media')
    touched = list(tables[media_table].columns.keys()).index('touched_at')
    kept = list(contents)
    kept[media_table] = [row[:touched] + row[touched + 1 :] for row in contents[media_table]]
    return kept


def lost(before: list[Any], after: list[Any]) -> int:
    """How many items of `before` are missing from `after` (items changed by the damage included)."""
    return sum(1 for item in before if item not in after)


@dataclass
class Tally:
    damages: int = 0
    refused_by_the_database: int = 0
    skipped: int = 0
    saves_refused: int = 0


async def check_damage(
    store: SqlStepStore,
    url: str,
    engine: AsyncEngine,
    damage: Damage,
    run_id: str,
    before: dict[str, Any],
    logged: Logged,
    unchanged: Callable[[], Awaitable[None]],
    tally: Tally,
) -> bool:
    """Damage the victim `run_id` (read as `before`) and check everything; `False` if the database refused
    the damage (the victim is then as it was)."""
    digest = hashlib.sha256(image_of(run_id)).hexdigest()
    try:
        async with engine.begin() as connection:
            changed = await connection.execute(text(damage.statement()), {'run': run_id, 'digest': digest})
            assert changed.rowcount == 1, damage
    except (IntegrityError, DBAPIError):
        tally.refused_by_the_database += 1
        return False
    tally.damages += 1
    logged.messages.clear()
    stored = await table_contents(engine)

    after = await observe(store, run_id)

    assert await table_contents(engine) == stored, 'reading wrote to the database'
    assert 'sentinel' in after['runs']
    assert 'c' in after['conversations'], "the sentinel's conversation is listed"
    assert set(before['conversations']) - set(after['conversations']) <= {f'conversation-{run_id}'}
    await unchanged()
    skipped = sum(len(before[name]) - len(after[name]) for name in ('events', 'snapshots', 'effects', 'units'))
    skipped += (run_id not in after['runs']) + (after['workflow'] is None)
    # One damaged row hides nothing else of its run.
    assert lost(before['events'], after['events']) <= (damage.table == 'events')
    assert lost(before['effects'], after['effects']) <= (damage.table == 'tool_effects')
    assert lost(before['units'], after['units']) <= (damage.table == 'durable_units')
    if damage.table != 'durable_workflows':
        assert after['workflow'] == before['workflow']
    assert 'a' in after['unresolved'] or damage.table == 'tool_effects'
    older = [snapshot for snapshot in before['snapshots'] if snapshot[0] < 3]
    assert all(snapshot in after['snapshots'] for snapshot in older), 'an older snapshot was hidden'
    if damage.table != 'runs':
        assert run_id in after['runs'] and after['run'] == before['run']
    if after['latest'] != before['latest']:
        complete = {snapshot[3] for snapshot in before['snapshots'] if snapshot[2] == 'complete'}
        assert after['latest'] is not None and after['latest'][1] in complete, 'the latest read falls back'
    if skipped and damage.column not in ('run_id', 'workflow_id'):  # a row given another id moved there: no log
        tally.skipped += 1
        assert logged.messages, f'{damage}: a record was skipped without a log line'

    summaries, _ = await read_report(store)
    assert 'sentinel' in {summary.run_id for summary in summaries}

    saved = history(run_id, 4)
    try:
        # A store of its own (as another process would be) reads the run's message rows afresh.
        async with SqlStepStore(url, auto_migrate=False) as fresh:
            await fresh.save_snapshot(ContinuableSnapshot(run_id=run_id, step_index=4, messages=saved))
    except (ValueError, LookupError):
        tally.saves_refused += 1
        # Only a reused blob's touched time may move: it is refreshed before the save (docs/media.md).
        assert untouched(await table_contents(engine)) == untouched(stored), f'{damage}: a refused save wrote'
    except IntegrityError:  # a damaged number collides with the next one the run hands out
        tally.saves_refused += 1
        assert damage.table in ('runs', 'messages', 'snapshots')
    else:
        newest = await store.list_snapshots(run_id=run_id, include_interrupted=True)
        for snapshot in newest:
            if snapshot.step_index == 4:
                assert fingerprint(snapshot.messages) == fingerprint(saved), f'{damage}: a save read back altered'
    await store.collect_media(grace=timedelta(0))
    await unchanged()
    return True


async def remove_victim(engine: AsyncEngine) -> None:
    """Remove every row but the sentinel's (damaged ones included), so that each damage is checked alone."""
    async with engine.begin() as connection:
        await connection.execute(text(f'DELETE FROM media WHERE digest NOT IN ({SENTINEL_BLOBS})'))
        await connection.execute(
            text(f'DELETE FROM messages WHERE line_id IS NULL OR line_id NOT IN ({SENTINEL_LINES})')
        )
        await connection.execute(text(f'DELETE FROM history_lines WHERE id IS NULL OR id NOT IN ({SENTINEL_LINES})'))
        await connection.execute(
            text("DELETE FROM conversations WHERE head_run_id IS NULL OR head_run_id <> 'sentinel'")
        )
        await connection.execute(text('DELETE FROM durable_units'))
        await connection.execute(text('DELETE FROM durable_workflows'))
        for table in reversed(TABLES.sorted_tables):
            if 'run_id' in table.columns:
                await connection.execute(text(f"DELETE FROM {table.name} WHERE run_id IS NULL OR run_id <> 'sentinel'"))


SENTINEL_LINES = "SELECT line_id FROM snapshots WHERE run_id = 'sentinel' AND line_id IS NOT NULL"
"""The line the sentinel's snapshots are on."""
SENTINEL_BLOBS = (
    f'SELECT digest FROM media WHERE EXISTS (SELECT 1 FROM messages WHERE line_id IN ({SENTINEL_LINES}) '
    "AND externalized AND CAST(body AS TEXT) LIKE '%' || digest || '%')"
)
"""The blobs the sentinel's messages refer to (their digests are in its bodies' markers)."""


@pytest.mark.parametrize('table', sorted(TARGETS))
async def test_one_damaged_value_in_any_column_hides_nothing_else(empty_database: EmptyDatabase, table: str) -> None:
    """Every damage of every column of `table` (one test per table, so that test workers share them)."""
    url, dialect = empty_database.url, empty_database.dialect
    engine = create_async_engine(url)
    try:
        async with SqlStepStore(url) as store:
            await check_every_damage(
                store, url, engine, [damage for damage in damages(dialect) if damage.table == table]
            )
    finally:
        await engine.dispose()


async def check_every_damage(store: SqlStepStore, url: str, engine: AsyncEngine, to_try: list[Damage]) -> None:
    unchanged = await write_sentinel(store)
    logged = Logged()
    logger = logging.getLogger('step_persistence')
    logger.addHandler(logged)
    tally = Tally()
    failures: list[str] = []
    try:
        victim: tuple[str, dict[str, Any]] | None = None
        for number, damage in enumerate(to_try):
            if victim is None:  # a victim the database refused to damage serves the next damage
                await write_victim(store, f'victim-{number}')
                victim = f'victim-{number}', await observe(store, f'victim-{number}')
                assert victim[1]['latest'] is not None and victim[1]['latest'][0] == 3
            run_id, before = victim
            try:
                damaged = await check_damage(store, url, engine, damage, run_id, before, logged, unchanged, tally)
            except Exception as error:  # every damage is tried; the failures are reported together
                failures.append(f'{damage}: {error!r}'[:300])
                damaged = True
            if damaged:
                await remove_victim(engine)
                victim = None
    finally:
        logger.removeHandler(logged)
    assert not failures, '\n'.join(failures)
    assert tally.damages > 0, f'the database refused every damage of {to_try[0].table}: {tally}'
