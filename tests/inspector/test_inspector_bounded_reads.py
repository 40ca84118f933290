"""Every page of the inspector is a bounded read served by indexes, whatever the store's size (issue 20: "stays
fast on a store of 100,000 runs").

- **Plans** (SQLite, PostgreSQL, MongoDB): every statement or command a page sends is a read, and its
  plan reads indexes (on MongoDB, where the test server's planner scans, the filter fixes an index's
  first field): no table or collection is scanned, and an index walked from one end (the
  newest-first order) is walked under a `LIMIT` (support/query_plans.py). A plan cannot show how many
  rows a keyed search finds (every run of an agent, say): the work test does.
- **Work** (SQLite): each page runs the same statements and as many SQLite virtual-machine
  instructions on a store with 1,000 older runs as with 10,000 (of the agent the list is filtered
  by, delegates of a run shown, each in a conversation of its own): a page reading every run, or
  every run of an agent, would do ten times the work. A read of every run is measured the same way
  as a control.

The memory store has no index to show, and the file store no query plans (its run list is counted in
tests/file_store/test_file_run_index.py): docs/inspector.md says what their pages read.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx2
import pytest
from sqlalchemy.ext.asyncio import create_async_engine

from step_persistence import MongoStepStore, RunRecord, SqliteStepStore, SqlStepStore, StepEvent, StepStore
from step_persistence.inspector import create_app
from step_persistence.protocol import write_steps
from step_persistence.records import StepWrites, utc_now
from support.inspector_scenario import FILLER_AGENT, Scenario, scenario_pages, write_scenario
from support.mongo_helpers import CommandLog, explain
from support.query_plans import full_scans, query_plan, statements_sent_by, unkeyed_index_walks
from support.servers.mongo import MongoServer
from support.servers.postgres import PostgresServer

pytestmark = pytest.mark.anyio

SMALL, LARGE = 1_000, 10_000
"""Older runs in the store the pages are first measured on, then in the store they are measured on again."""

READS = ('SELECT', 'WITH')
TRANSACTION_CONTROL = frozenset({'BEGIN', 'COMMIT', 'ROLLBACK', 'SAVEPOINT', 'RELEASE'})
MONGO_READS = frozenset({'find', 'aggregate', 'count', 'distinct', 'getMore', 'endSessions'})
"""Commands that only read (`endSessions` ends the client's sessions when it closes)."""


@asynccontextmanager
async def inspector(store: StepStore) -> AsyncIterator[Callable[[str], Awaitable[None]]]:
    """`get(address)`: one page of the inspector over `store`, which must answer 200."""
    transport = httpx2.ASGITransport(app=create_app(store))
    async with httpx2.AsyncClient(transport=transport, base_url='http://inspector') as client:

        async def get(address: str) -> None:
            response = await client.get(address)
            assert response.status_code == 200, (address, response.text[:300])

        yield get


async def older_runs(store: StepStore, first: int, last: int) -> None:
    """Runs `first` to `last` of the `filler` agent, two days old (older than every run of the scenario), each
    delegated from `orchestrator-run` and in a conversation of its own, with a start and an end event."""
    start = utc_now() - timedelta(days=2)
    for number in range(first, last):
        run_id, moment = f'older-{number:05d}', start + timedelta(seconds=number)
        await store.register_run(
            RunRecord(
                run_id=run_id,
                agent_name=FILLER_AGENT,
                conversation_id=run_id,
                parent_run_id='orchestrator-run',
                started_at=moment,
            )
        )
        events = [
            StepEvent(run_id=run_id, kind=kind, step_index=step, timestamp=moment)
            for step, kind in enumerate(('run_started', 'run_completed'))
        ]
        await write_steps(store, StepWrites(events=events))


def plan_problems(statement: str, plan: str) -> list[str]:
    """What makes a statement's plan read more than it returns: table scans, and index walks with no LIMIT."""
    problems = full_scans(plan)
    if not re.search(r'\bLIMIT\b', statement, re.IGNORECASE):
        problems += unkeyed_index_walks(plan)
    return problems


async def _finish(scenario: Scenario) -> None:
    scenario.release()
    await scenario.held_task


# --- SQLite: the store's own engine on a connection of the test's, whose trace says what is sent ---


@dataclass
class Traced:
    """The statements run on a SQLite connection, and the virtual-machine instructions they took."""

    connection: sqlite3.Connection
    statements: list[str]
    instructions: int = 0

    @contextmanager
    def watching(self) -> Iterator[None]:
        self.statements.clear()
        self.instructions = 0

        def count() -> int:
            self.instructions += 1
            return 0

        self.connection.set_trace_callback(self.statements.append)
        self.connection.set_progress_handler(count, 1)
        try:
            yield
        finally:
            self.connection.set_trace_callback(None)
            self.connection.set_progress_handler(None, 1)

    def reads(self) -> list[str]:
        """The statements, transaction control left out; every one must be a read."""
        sent = [statement for statement in self.statements if statement.split()[0].upper() not in TRANSACTION_CONTROL]
        assert sent, 'nothing was read'
        writes = [statement for statement in sent if not statement.lstrip().upper().startswith(READS)]
        assert writes == [], writes
        return sent


@pytest.fixture
async def sqlite_store(tmp_path: Path) -> AsyncIterator[tuple[SqliteStepStore, Traced, Path]]:
    database = tmp_path / 'runs.db'
    connection = sqlite3.connect(database, check_same_thread=False)
    try:
        async with SqliteStepStore(connection=connection) as store:
            scenario = await write_scenario(store, crash_spec=None, fillers=3)
            try:
                yield store, Traced(connection, []), database
            finally:
                await _finish(scenario)
    finally:
        connection.close()


def sqlite_plan(database: Path, statement: str) -> str:
    with sqlite3.connect(database) as explaining:
        return '\n'.join(str(row[-1]) for row in explaining.execute(f'EXPLAIN QUERY PLAN {statement}'))


async def test_every_page_reads_sqlite_through_indexes(
    sqlite_store: tuple[SqliteStepStore, Traced, Path],
) -> None:
    store, traced, database = sqlite_store
    await older_runs(store, 0, 20)
    async with inspector(store) as get:
        for address in await scenario_pages(store):
            with traced.watching():
                await get(address)
            for statement in traced.reads():
                plan = sqlite_plan(database, statement)
                assert plan_problems(statement, plan) == [], (address, statement, plan)
    with traced.watching():
        await store.list_runs(newest_first=True)
    [unbounded] = traced.reads()
    assert plan_problems(unbounded, sqlite_plan(database, unbounded)), 'the check sees a read of every run'


@dataclass(frozen=True)
class Work:
    statements: int
    instructions: int


async def test_every_page_does_the_same_work_on_a_store_ten_times_larger(
    sqlite_store: tuple[SqliteStepStore, Traced, Path],
) -> None:
    store, traced, _ = sqlite_store
    addresses = await scenario_pages(store)

    async def measure() -> dict[str, Work]:
        measured: dict[str, Work] = {}
        async with inspector(store) as get:
            for address in addresses:
                with traced.watching():
                    await get(address)
                measured[address] = Work(len(traced.reads()), traced.instructions)
        with traced.watching():
            await store.list_runs(agent_name=FILLER_AGENT, newest_first=True)
        measured['control: every run of the agent'] = Work(len(traced.reads()), traced.instructions)
        return measured

    await older_runs(store, 0, SMALL)
    small = await measure()
    await older_runs(store, SMALL, LARGE)
    large = await measure()
    control = 'control: every run of the agent'
    assert large[control].instructions > 5 * small[control].instructions, (small[control], large[control])
    grown = {
        address: (small[address], large[address])
        for address in addresses
        if large[address].statements != small[address].statements
        or large[address].instructions > 1.2 * small[address].instructions
    }
    assert grown == {}, grown


# --- PostgreSQL: the statements captured from the engine, explained with scans and sorts disabled ---


async def test_every_page_reads_postgresql_through_indexes(postgres_server: PostgresServer) -> None:
    name = await postgres_server.create_database()
    engine = create_async_engine(postgres_server.url(name))
    try:
        store = SqlStepStore(engine)
        await store.migrate()
        scenario = await write_scenario(store, crash_spec=None, fillers=3)
        try:
            await older_runs(store, 0, 20)
            async with inspector(store) as get:
                for address in await scenario_pages(store):
                    captured = await statements_sent_by(engine, lambda address=address: get(address), kinds=('',))
                    for statement, parameters in captured:
                        assert statement.lstrip().upper().startswith(READS), (address, statement)
                        plan = await query_plan(engine, statement, parameters)
                        assert plan_problems(statement, plan) == [], (address, statement, plan)
            [(unbounded, parameters)] = await statements_sent_by(engine, lambda: store.list_runs(newest_first=True))
            plan = await query_plan(engine, unbounded, parameters)
            assert plan_problems(unbounded, plan), 'the check sees a read of every run'
        finally:
            await _finish(scenario)
        await store.aclose()
    finally:
        await engine.dispose()
        await postgres_server.drop_database(name)


# --- MongoDB: the commands recorded by the client, explained on the server ---


async def fixes_an_index_prefix(db: Any, name: str, collection: str, command: dict[str, Any]) -> bool:
    """Whether a `find` gives a plain value for the first field of one of the collection's indexes, which
    mongod then reads. The test server's planner uses no index for a filter that also holds an operator
    other than a range (`{'run_id': ..., 'state': {'$ne': None}}`); mongod bounds the scan by `run_id`."""
    query = command.get('filter') or {}
    indexes = await db[collection].index_information()
    leading = {index['key'][0][0] for index in indexes.values()}
    return name == 'find' and any(field in query and not isinstance(query[field], dict) for field in leading)


async def test_every_page_reads_mongodb_through_indexes(mongo_server: MongoServer) -> None:
    log = CommandLog()
    client = log.client(mongo_server.uri)
    database = f'inspector_reads_{utc_now().strftime("%H%M%S%f")}'
    try:
        store = MongoStepStore(client=client, database=database)
        scenario = await write_scenario(store, crash_spec=None, fillers=3)
        try:
            await older_runs(store, 0, 20)
            async with inspector(store) as get:
                for address in await scenario_pages(store):
                    log.commands.clear()
                    await get(address)
                    sent: list[tuple[str, Any, Any]] = list(log.commands)
                    assert sent, address
                    assert [name for name, _, _ in sent if name not in MONGO_READS] == [], (address, sent)
                    for name, collection, command in sent:
                        if name not in ('find', 'aggregate', 'count', 'distinct') or collection == 'counters':
                            continue  # `counters` is found by `_id`, which the test server scans for
                        stages = await explain(client[database], command)
                        if 'COLLSCAN' in [stage for stage, _ in stages]:
                            assert await fixes_an_index_prefix(client[database], name, collection, command), (
                                address,
                                command,
                                stages,
                            )
            unindexed = {'find': 'runs', 'filter': {'metadata.unindexed': 1}}
            assert 'COLLSCAN' in [stage for stage, _ in await explain(client[database], unindexed)], 'the check works'
        finally:
            await _finish(scenario)
    finally:
        await client.drop_database(database)
        await client.close()
