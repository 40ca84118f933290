"""Round trips a PostgreSQL store makes per agent tool step, by kind of statement.

A `FunctionModel`-style scripted agent makes K sequential tool calls with `StepPersistence` on a
`SqlStepStore` sharing an application engine, so every statement goes through SQLAlchemy Core,
whose `begin`, `commit` and `before_cursor_execute` events count them. Starts a throwaway
PostgreSQL cluster as the test suite does (tests/support/servers/postgres.py).

    cd benchmarks && uv run python pg_round_trips.py [--steps 20]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from pydantic_ai import Agent
from sqlalchemy import event
from sqlalchemy.ext.asyncio import create_async_engine

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / 'tests'))

from support.scripted import calls, scripted, text  # noqa: E402
from support.servers.postgres import postgres_server  # noqa: E402

from step_persistence import SqlStepStore, StepPersistence  # noqa: E402


def kind(statement: str) -> str:
    """The first two words of a statement (`INSERT INTO`, `UPDATE runs`, `WITH claimed`)."""
    return ' '.join(statement.split()[:2])


async def count(url: str, steps: int) -> Counter[str]:
    engine = create_async_engine(url)
    counts: Counter[str] = Counter()

    @event.listens_for(engine.sync_engine, 'before_cursor_execute')
    def on_statement(connection: Any, cursor: Any, statement: str, *args: Any) -> None:
        counts[kind(statement)] += 1

    @event.listens_for(engine.sync_engine, 'begin')
    def on_begin(connection: Any) -> None:
        counts['BEGIN'] += 1

    @event.listens_for(engine.sync_engine, 'commit')
    def on_commit(connection: Any) -> None:
        counts['COMMIT'] += 1

    try:
        async with SqlStepStore(engine) as store:
            await store.migrate()
            counts.clear()
            script = [calls(('lookup', {'step': step})) for step in range(steps)]
            agent = Agent(scripted(*script, text('done')), capabilities=[StepPersistence(store=store)])

            @agent.tool_plain
            def lookup(step: int) -> str:
                return f'result {step}'

            await agent.run('go')
    finally:
        await engine.dispose()
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--steps', type=int, default=20)
    steps = parser.parse_args().steps
    with contextlib.contextmanager(postgres_server.__wrapped__)() as server:

        async def measure() -> Counter[str]:
            return await count(server.url(await server.create_database()), steps)

        counts = asyncio.run(measure())
    print('| statement | per run | per step |\n|---|---:|---:|')
    for name, number in sorted(counts.items()):
        print(f'| {name} | {number} | {number / steps:.2f} |')
    total = sum(counts.values())
    print(f'| all round trips | {total} | {total / steps:.2f} |')


if __name__ == '__main__':
    main()
