"""Round trips a PostgreSQL store makes per agent tool step, by kind of statement and at the driver.

A `FunctionModel`-style scripted agent makes K sequential tool calls with `StepPersistence` on a
`SqlStepStore`, on an application engine (every statement goes through SQLAlchemy Core, whose
`before_cursor_execute` events name them) and on the store's own engine built from a URL. Round
trips are counted at the driver (`tests/support/round_trips.py`: every asyncpg protocol call that
waits for the server: prepares, executions, `BEGIN` and `COMMIT`); Core's `begin` and `commit`
events are shown beside them (in autocommit they fire with nothing sent). With `--server-log`,
the cluster logs every statement it runs (`log_statement=all`) and the statements it executed
during the run are counted from its log, as a check from the server's side. Starts a throwaway
PostgreSQL cluster as the test suite does (tests/support/servers/postgres.py).

    cd benchmarks && uv run python pg_round_trips.py [--steps 20] [--server-log]
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
from sqlalchemy import event, text
from sqlalchemy.ext.asyncio import create_async_engine

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / 'tests'))

from step_persistence import SqlStepStore, StepPersistence
from support.round_trips import counting_every_engine
from support.scripted import calls, scripted
from support.scripted import text as text_part
from support.servers.postgres import postgres_server


def kind(statement: str) -> str:
    """The first two words of a statement (`INSERT INTO`, `UPDATE runs`, `WITH locked`)."""
    return ' '.join(statement.split()[:2])


async def run_agent(store: SqlStepStore, steps: int) -> None:
    script = [calls(('lookup', {'step': step})) for step in range(steps)]
    agent = Agent(scripted(*script, text_part('done')), capabilities=[StepPersistence(store=store)])

    @agent.tool_plain
    def lookup(step: int) -> str:
        return f'result {step}'

    await agent.run('go')


async def count(
    url: str, steps: int, *, own_engine: bool, server_log: bool = False
) -> tuple[Counter[str], Counter[str], Counter[str]]:
    """Per run: Core's statements and `begin`/`commit` events (application engine only), the round trips
    asyncpg made, and (own engine, with `server_log`) the statements in the server's log."""
    core: Counter[str] = Counter()
    with counting_every_engine() as wire:
        if own_engine:
            async with SqlStepStore(url) as store:
                await store.migrate()
                log = await server_log_lines(url) if server_log else None
                await store.list_runs()  # the reloaded setting reaches the store's session at its next statement
                wire.clear()
                since = 0 if log is None else len(log.read_text().splitlines())
                await run_agent(store, steps)
            return core, wire, Counter() if log is None else logged_statements(log, since)
        engine = create_async_engine(url)

        @event.listens_for(engine.sync_engine, 'before_cursor_execute')
        def on_statement(connection: Any, cursor: Any, statement: str, *args: Any) -> None:
            core[kind(statement)] += 1

        @event.listens_for(engine.sync_engine, 'begin')
        def on_begin(connection: Any) -> None:
            core['Core begin event'] += 1

        @event.listens_for(engine.sync_engine, 'commit')
        def on_commit(connection: Any) -> None:
            core['Core commit event'] += 1

        try:
            async with SqlStepStore(engine) as store:
                await store.migrate()
                core.clear()
                wire.clear()
                await run_agent(store, steps)
        finally:
            await engine.dispose()
    return core, wire, Counter()


async def server_log_lines(url: str) -> Path:
    """The cluster's log file, with every statement of every session logged from now on (the cluster is
    the benchmark's own)."""
    engine = create_async_engine(url, isolation_level='AUTOCOMMIT')
    try:
        async with engine.connect() as connection:
            data = (await connection.execute(text('SHOW data_directory'))).scalar_one()
            await connection.execute(text("ALTER SYSTEM SET log_statement = 'all'"))
            await connection.execute(text('SELECT pg_reload_conf()'))
    finally:
        await engine.dispose()
    return Path(data).parent / 'server.log'


def logged_statements(log: Path, since: int) -> Counter[str]:
    """The statements the server logged after line `since`, by kind (`execute` of a prepared statement, or a
    simple query's first word)."""
    found: Counter[str] = Counter()
    for line in log.read_text().splitlines()[since:]:
        if 'LOG:  execute ' in line:
            found['execute (prepared)'] += 1
        elif 'LOG:  statement: ' in line:
            found[line.split('LOG:  statement: ', 1)[1].split(maxsplit=1)[0].upper()] += 1
    return found


def table(title: str, counts: Counter[str], steps: int) -> str:
    lines = [f'\n{title}\n', '| kind | per run | per step |', '|---|---:|---:|']
    lines.extend(f'| {name} | {number} | {number / steps:.2f} |' for name, number in sorted(counts.items()))
    total = sum(number for name, number in counts.items() if not name.startswith('Core '))
    lines.append(f'| all (Core events aside) | {total} | {total / steps:.2f} |')
    return '\n'.join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--steps', type=int, default=20)
    parser.add_argument('--server-log', action='store_true', help="count the statements in the server's log too")
    arguments = parser.parse_args()
    steps = arguments.steps
    with contextlib.contextmanager(postgres_server.__wrapped__)() as server:

        async def measure() -> None:
            shared = server.url(await server.create_database())
            core, wire, _ = await count(shared, steps, own_engine=False)
            print(table('Application engine: statements and events seen by Core', core, steps))
            print(table('Application engine: round trips at the driver (asyncpg)', wire, steps))
            own = server.url(await server.create_database())
            _, wire, logged = await count(own, steps, own_engine=True, server_log=arguments.server_log)
            print(table("The store's own engine (a URL): round trips at the driver (asyncpg)", wire, steps))
            if arguments.server_log:
                print(table("The store's own engine: statements in the server's log", logged, steps))

        asyncio.run(measure())


if __name__ == '__main__':
    main()
