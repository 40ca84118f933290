"""What the SQL store costs: store operations per second, and the persistence overhead of an agent step.

Three measurements, printed as Markdown tables:

1. **Store operations** on SQLite (a WAL file, the store's defaults) and PostgreSQL: `append_event`,
   `record_tool_effect`, `save_snapshot` (a history growing by two messages per save, encoded
   once as the capability does) and `write_batch` of the three flushes the capability makes per
   agent step (before the model request: an event and the previous step's snapshot; before the
   tool body: two events and the started ledger record; after it: an event and the completed
   record). Each row gives operations per second, wall and CPU microseconds per operation.
2. **Raw sqlite3**: the same SQL statements (one `BEGIN IMMEDIATE ... COMMIT` per operation) run
   directly with the `sqlite3` module in this thread, no event loop: the floor the store is
   compared with.
3. **Agent overhead**: a `FunctionModel` agent making K sequential tool calls (K = 10, 50, 200),
   without persistence, with `StepPersistence` on an `InMemoryStepStore` (the capability's own
   work) and on a `SqliteStepStore` file. Overhead per step = (median run time with - median run
   time without) / K, in wall time and in CPU time of the whole process (`time.process_time`,
   which counts worker threads too and is less disturbed by other load on the machine).

    python benchmarks/sql_store_ops.py [--ops 2000] [--rounds 7] [--postgres-url URL | --no-postgres]
                                       [--profile sqlite-agent.prof]

Without `--postgres-url`, a throwaway PostgreSQL cluster is started as the test suite starts one
(Debian's postgresql binaries, tests/support/servers/postgres.py).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import os
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, ToolCallPart, ToolReturnPart
from pydantic_ai.usage import UsageLimits

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / 'tests'))

from step_persistence import (
    ContinuableSnapshot,
    InMemoryStepStore,
    PostgresStepStore,
    RunRecord,
    SqliteStepStore,
    SqlStepStore,
    StepEvent,
    StepPersistence,
    StepStore,
    ToolEffectRecord,
)
from step_persistence._history import HistoryEncoder
from step_persistence.records import StepWrites
from support.scripted import calls, scripted, text

TOOL_RESULT = 'lorem ipsum ' * 20


@dataclass(frozen=True)
class Timing:
    """Wall and CPU seconds of `count` operations."""

    count: int
    wall: float
    cpu: float

    def row(self, name: str) -> str:
        per_wall, per_cpu = self.wall / self.count * 1e6, self.cpu / self.count * 1e6
        return f'| {name} | {self.count / self.wall:,.0f} | {per_wall:,.0f} | {per_cpu:,.0f} |'


@contextlib.contextmanager
def clocks() -> Iterator[list[float]]:
    """Yields a list that holds `[wall, cpu]` seconds once the block ends."""
    spent: list[float] = []
    wall, cpu = time.perf_counter(), time.process_time()
    yield spent
    spent.extend([time.perf_counter() - wall, time.process_time() - cpu])


# --- store operations ---


class StepHistory:
    """A history growing by one tool call and its return per step, encoded once per message."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self.messages: list[ModelMessage] = [ModelRequest.user_text_prompt('start a long run')]
        self.encoder = HistoryEncoder()
        self.step = 0

    def grow(self) -> None:
        call_id = f'call-{self.step}'
        self.messages.append(ModelResponse(parts=[ToolCallPart('lookup', {'step': self.step}, call_id)]))
        self.messages.append(ModelRequest(parts=[ToolReturnPart('lookup', f'{self.step}: {TOOL_RESULT}', call_id)]))
        self.step += 1

    def snapshot(self) -> ContinuableSnapshot:
        self.grow()
        return ContinuableSnapshot.from_encoded(
            run_id=self.run_id,
            step_index=self.step,
            messages=list(self.messages),
            encoded=self.encoder.encode(self.messages).messages,
            state='complete',
            conversation_id=None,
            parent_run_id=None,
            agent_name=None,
            idempotency_key=f'snapshot:{self.step}',
        )


def event(run_id: str, kind: Any, step: int, call_id: str | None = None) -> StepEvent:
    return StepEvent(run_id=run_id, kind=kind, step_index=step, tool_call_id=call_id, idempotency_key=f'{kind}:{step}')


def effect(run_id: str, step: int, status: Any) -> ToolEffectRecord:
    return ToolEffectRecord(run_id=run_id, tool_call_id=f'call-{step}', tool_name='lookup', status=status)


def step_flushes(history: StepHistory) -> list[StepWrites]:
    """The three batches the capability writes for one tool-calling step."""
    run_id, step = history.run_id, history.step
    return [
        StepWrites(events=[event(run_id, 'model_request_started', step)], snapshots=[history.snapshot()]),
        StepWrites(
            tool_effects=[effect(run_id, step, 'started')],
            events=[event(run_id, 'model_request_completed', step), event(run_id, 'tool_call_started', step)],
        ),
        StepWrites(
            tool_effects=[effect(run_id, step, 'completed')], events=[event(run_id, 'tool_call_completed', step)]
        ),
    ]


async def timed(count: int, operation: Callable[[int], Awaitable[None]]) -> Timing:
    with clocks() as spent:
        for number in range(count):
            await operation(number)
    return Timing(count, *spent)


async def store_operations(store: SqlStepStore, ops: int) -> list[tuple[str, Timing]]:
    """Time each operation on its own run (registered first), after a warm-up."""
    results: list[tuple[str, Timing]] = []

    async def register(name: str) -> str:
        await store.register_run(RunRecord(run_id=name))
        return name

    run = await register('events')
    await timed(50, lambda n: store.append_event(event(run, 'tool_call_started', -n - 1)))
    results.append(('append_event', await timed(ops, lambda n: store.append_event(event(run, 'tool_call_started', n)))))

    run = await register('effects')
    statuses = ('started', 'completed')
    results.append(
        (
            'record_tool_effect',
            await timed(ops, lambda n: store.record_tool_effect(effect(run, n // 2, statuses[n % 2]))),
        )
    )

    history = StepHistory(await register('snapshots'))
    results.append(('save_snapshot (+2 messages)', await timed(ops, lambda n: store.save_snapshot(history.snapshot()))))

    history = StepHistory(await register('batches'))
    flushes: list[StepWrites] = []

    async def flush(number: int) -> None:
        if not flushes:
            flushes.extend(step_flushes(history))
        await store.write_batch(flushes.pop(0))

    results.append(('write_batch (a step: 3 flushes)', await timed(3 * (ops // 3), flush)))
    return results


def raw_sqlite3(path: Path, ops: int) -> list[tuple[str, Timing]]:
    """The statements of `append_event` and of a step's three flushes, with the sqlite3 module directly."""
    connection = sqlite3.connect(path, isolation_level=None)
    connection.execute('PRAGMA journal_mode = WAL')
    connection.execute('PRAGMA synchronous = NORMAL')
    connection.execute('PRAGMA foreign_keys = ON')
    insert_event = (
        'INSERT INTO events (run_id, kind, step_index, timestamp, metadata, idempotency_key) '
        "SELECT run_id, ?, ?, '2025-01-01 00:00:00.000000', '{}', ? FROM runs WHERE run_id = ? "
        'ON CONFLICT (run_id, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING'
    )
    upsert_effect = (
        'INSERT INTO tool_effects (run_id, tool_call_id, tool_name, status, started_at) '
        "SELECT run_id, ?, 'lookup', ?, '2025-01-01 00:00:00.000000' FROM runs WHERE run_id = ? "
        'ON CONFLICT (run_id, tool_call_id) DO UPDATE SET status = excluded.status'
    )
    connection.execute(
        "INSERT INTO runs (run_id, metadata, started_at) VALUES ('raw', '{}', '2025-01-01 00:00:00.000000')"
    )

    def transaction(*statements: tuple[str, tuple[Any, ...]]) -> None:
        connection.execute('BEGIN IMMEDIATE')
        for sql, parameters in statements:
            connection.execute(sql, parameters)
        connection.execute('COMMIT')

    results = []
    with clocks() as spent:
        for number in range(ops):
            transaction((insert_event, ('tool_call_started', number, f'raw:{number}', 'raw')))
    results.append(('append_event', Timing(ops, *spent)))
    with clocks() as spent:
        for number in range(ops // 3):
            transaction(
                (insert_event, ('model_request_started', number, f'a:{number}', 'raw')),
                ('UPDATE runs SET last_snapshot_seq = last_snapshot_seq + 1 WHERE run_id = ?', ('raw',)),
            )
            transaction(
                (upsert_effect, (f'c{number}', 'started', 'raw')),
                (insert_event, ('model_request_completed', number, f'b:{number}', 'raw')),
                (insert_event, ('tool_call_started', number, f'c:{number}', 'raw')),
            )
            transaction(
                (upsert_effect, (f'c{number}', 'completed', 'raw')),
                (insert_event, ('tool_call_completed', number, f'd:{number}', 'raw')),
            )
    results.append(("a step's 3 flushes (snapshot: the run-row update only)", Timing(3 * (ops // 3), *spent)))
    connection.close()
    return results


# --- agent overhead ---


def lookup_agent(steps: int, capabilities: list[Any]) -> Agent[None, str]:
    def respond(history: list[ModelMessage]) -> ModelResponse:
        step = sum(isinstance(message, ModelResponse) for message in history)
        return calls(('lookup', {'step': step}, f'call-{step}')) if step < steps else text('done')

    agent = Agent(scripted(respond), capabilities=capabilities)

    @agent.tool_plain
    def lookup(step: int) -> str:
        return f'{step}: {TOOL_RESULT}'

    return agent


async def agent_run_seconds(steps: int, store: StepStore | None) -> tuple[float, float]:
    capabilities = [] if store is None else [StepPersistence(store=store, agent_name='bench')]
    agent = lookup_agent(steps, capabilities)
    with clocks() as spent:
        await agent.run('start', usage_limits=UsageLimits(request_limit=None))
    return spent[0], spent[1]


async def agent_overhead(directory: Path, steps_list: list[int], rounds: int) -> list[str]:
    rows = []
    async with SqliteStepStore(directory / 'agent.db') as sqlite_store:
        await agent_run_seconds(3, sqlite_store)
        memory_store = InMemoryStepStore()
        for steps in steps_list:
            runs: dict[str, list[tuple[float, float]]] = {'none': [], 'memory': [], 'sqlite': []}
            for _ in range(rounds):
                for name, store in (('none', None), ('memory', memory_store), ('sqlite', sqlite_store)):
                    runs[name].append(await agent_run_seconds(steps, store))
            base_wall = statistics.median(wall for wall, _ in runs['none'])
            base_cpu = statistics.median(cpu for _, cpu in runs['none'])
            for name in ('memory', 'sqlite'):
                wall = statistics.median(wall for wall, _ in runs[name])
                cpu = statistics.median(cpu for _, cpu in runs[name])
                rows.append(
                    f'| {steps} | {name} | {base_wall * 1e3 / steps:.2f} | {wall * 1e3 / steps:.2f} | '
                    f'{(wall - base_wall) * 1e3 / steps:.2f} | {(cpu - base_cpu) * 1e3 / steps:.2f} |'
                )
    return rows


# --- main ---


@contextlib.asynccontextmanager
async def postgres(url: str | None) -> AsyncIterator[str]:
    """`url`, or a fresh database on a throwaway cluster started as the test suite starts one."""
    if url is not None:
        yield url
        return
    from support.servers.postgres import postgres_server

    with contextlib.contextmanager(postgres_server.__wrapped__)() as server:
        name = await server.create_database()
        yield server.url(name)


def table(title: str, rows: list[tuple[str, Timing]]) -> None:
    print(f'\n{title}\n')
    print('| operation | ops/s (wall) | µs/op wall | µs/op CPU |')
    print('|---|---:|---:|---:|')
    for name, timing in rows:
        print(timing.row(name))


async def main(arguments: argparse.Namespace) -> None:
    print(f'load average before: {os.getloadavg()}, CPUs: {os.cpu_count()}')
    with tempfile.TemporaryDirectory() as directory:
        root = Path(directory)
        async with SqliteStepStore(root / 'ops.db') as store:
            table('SQLite store (WAL, synchronous=NORMAL)', await store_operations(store, arguments.ops))
        async with SqliteStepStore(root / 'raw.db') as store:
            await store.migrate()
        table('Raw sqlite3, same statements, no event loop', raw_sqlite3(root / 'raw.db', arguments.ops))
        if arguments.postgres:
            async with postgres(arguments.postgres_url) as url, PostgresStepStore(url) as store:
                table('PostgreSQL store (asyncpg)', await store_operations(store, arguments.ops))
        profile = cProfile.Profile() if arguments.profile else None
        with profile or contextlib.nullcontext():
            rows = await agent_overhead(root, arguments.steps, arguments.rounds)
        if profile is not None:
            profile.dump_stats(arguments.profile)
        print(f'\nAgent overhead per step (median of {arguments.rounds} runs each)\n')
        print('| K | store | ms/step without | ms/step with | overhead ms/step (wall) | overhead ms/step (CPU) |')
        print('|---:|---|---:|---:|---:|---:|')
        print('\n'.join(rows))
    print(f'\nload average after: {os.getloadavg()}')


if __name__ == '__main__':
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--ops', type=int, default=2000, help='operations per store measurement')
    parser.add_argument('--rounds', type=int, default=7, help='agent runs per configuration')
    parser.add_argument('--steps', type=int, nargs='+', default=[10, 50, 200], help='tool calls per agent run')
    parser.add_argument('--postgres-url', help='a database to use instead of a throwaway cluster')
    parser.add_argument('--no-postgres', dest='postgres', action='store_false')
    parser.add_argument('--profile', help='write a cProfile of the agent runs to this file')
    asyncio.run(main(parser.parse_args()))
