"""Where an agent step's persistence time goes: the profiles RESULTS.md cites.

    cd benchmarks && uv run python profile_agent.py [--backend sqlite|postgres|file|memory|none]
                                                    [--steps 50] [--runs 4] [--timings]

Runs the benchmark's FunctionModel agent (`bench.lookup_agent`) `--runs` times with
`StepPersistence` on a fresh store (PostgreSQL: a throwaway cluster, as `make bench` starts) and
prints:

1. a pyinstrument profile of the event-loop thread (where the capability and the store spend
   the loop's time, and how long the loop waits on other threads);
2. for SQLite, a cProfile of the operations inside their transactions, by own time (thread CPU
   clock): statements, SQLAlchemy's machinery, the store's own Python;
3. for SQLite, where a write's wall time goes, medians over the run: from submitting it to the
   writer thread picking it up (the thread's wake-up), the operation inside its transaction, and
   the whole await as the event loop sees it (the rest is `BEGIN`, `COMMIT` and the hand-back).

With `--timings`, only 3, with no profiler running (profilers inflate these spans).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import pstats
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from pyinstrument import Profiler

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / 'tests'))

from bench import run_agent, servers

import step_persistence.stores.sql.executors as executors
import step_persistence.stores.sql.sqlite_writer as sqlite_writer
from step_persistence import FileStepStore, InMemoryStepStore, PostgresStepStore, SqliteStepStore, StepPersistence
from step_persistence.protocol import StepStore

operation_profile = cProfile.Profile(time.thread_time)
_with_transaction = executors._with_transaction
spans: dict[str, list[float]] = {'picked up after': [], 'operation': [], 'await': []}
_writer_run = sqlite_writer.SqliteWriter.run


def _profiled_operation(*arguments: Any, **options: Any) -> Any:
    operation_profile.enable()
    try:
        return _with_transaction(*arguments, **options)
    finally:
        operation_profile.disable()


async def _timed_write(self: sqlite_writer.SqliteWriter, operation: Callable[[Any], Any], *, write: bool) -> Any:
    submitted = time.perf_counter()

    def timed(connection: Any) -> Any:
        started = time.perf_counter()
        spans['picked up after'].append(started - submitted)
        try:
            return operation(connection)
        finally:
            spans['operation'].append(time.perf_counter() - started)

    result = await _writer_run(self, timed, write=write)
    spans['await'].append(time.perf_counter() - submitted)
    return result


@contextlib.asynccontextmanager
async def open_store(backend: str, root: Path) -> AsyncIterator[StepStore | None]:
    if backend == 'none':
        yield None
    elif backend == 'memory':
        yield InMemoryStepStore()
    elif backend == 'file':
        yield FileStepStore(root / 'file-store')
    elif backend == 'sqlite':
        async with SqliteStepStore(root / 'runs.db') as store:
            yield store
    else:
        with servers(root, postgres=True, mongo=False) as found:
            async with PostgresStepStore(found.postgres_url(await found.create_database())) as store:
                yield store


async def main(arguments: argparse.Namespace) -> None:
    if not arguments.timings:
        executors._with_transaction = _profiled_operation
    sqlite_writer.SqliteWriter.run = _timed_write  # type: ignore[method-assign]
    with tempfile.TemporaryDirectory() as directory:
        async with open_store(arguments.backend, Path(directory)) as store:

            def capabilities() -> list[Any]:
                return [] if store is None else [StepPersistence(store=store, agent_name='profile')]

            await run_agent(3, capabilities())
            global operation_profile
            operation_profile = cProfile.Profile(time.thread_time)  # the warm-up run (schema creation) is left out
            for found in spans.values():
                found.clear()
            profiler = Profiler(interval=0.0005)
            if not arguments.timings:
                profiler.start()
            for _ in range(arguments.runs):
                await run_agent(arguments.steps, capabilities())
            if not arguments.timings:
                profiler.stop()
                print(profiler.output_text(unicode=False, color=False, show_all=False))
            if arguments.backend == 'sqlite' and not arguments.timings:
                print('Operations inside their transactions (cProfile, thread CPU, own time):')
                pstats.Stats(operation_profile).sort_stats('tottime').print_stats(25)
            if arguments.backend == 'sqlite':
                print('A write, as wall time (medians over the run, µs):')
                for name, found in spans.items():
                    print(f'  {name}: {statistics.median(found) * 1e6:.0f} ({len(found)} writes)')


if __name__ == '__main__':
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--backend', choices=['sqlite', 'postgres', 'file', 'memory', 'none'], default='sqlite')
    parser.add_argument('--steps', type=int, default=50)
    parser.add_argument('--runs', type=int, default=4)
    parser.add_argument('--timings', action='store_true', help='only the wall-time spans of writes, no profiler')
    asyncio.run(main(parser.parse_args()))
