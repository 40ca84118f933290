"""Where an agent step's persistence time goes: the profiles RESULTS.md cites.

    cd benchmarks && uv run python profile_agent.py [--backend sqlite|memory|none] [--steps 50] [--runs 4]

Runs the benchmark's FunctionModel agent (`bench.lookup_agent`) `--runs` times with
`StepPersistence` on a fresh store and prints:

1. a pyinstrument profile of the event-loop thread (where the capability and the store spend
   the loop's time, and how long the loop waits on worker threads);
2. a cProfile of the SQLite store's worker-thread transactions (`ThreadExecutor` runs each
   operation's whole transaction in one worker-thread call), by own time: statements, commits,
   SQLAlchemy's execution machinery;
3. the per-transaction floor on this machine: a thread hop, an empty write transaction, an
   `append_event`.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import pstats
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio.to_thread
from pyinstrument import Profiler

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench import run_agent  # noqa: E402

import step_persistence.stores.sql.executors as executors  # noqa: E402
from step_persistence import InMemoryStepStore, RunRecord, SqliteStepStore, StepEvent, StepPersistence  # noqa: E402

worker_profile = cProfile.Profile()
_in_transaction = executors._in_transaction


def _profiled_transaction(*arguments: Any) -> Any:
    worker_profile.enable()
    try:
        return _in_transaction(*arguments)
    finally:
        worker_profile.disable()


async def floor(store: SqliteStepStore, count: int = 2000) -> None:
    """CPU microseconds of a bare thread hop, an empty write transaction and an append_event."""
    executor: Any = store._db._executor  # a measurement of the store's internals, on purpose
    await store.register_run(RunRecord(run_id='floor'))

    def nothing(transaction: Any = None) -> None:
        return None

    start = time.process_time()
    for _ in range(count):
        await anyio.to_thread.run_sync(nothing)
    hop = time.process_time() - start
    start = time.process_time()
    for _ in range(count):
        await executor.run(nothing, write=True, options={})
    transaction = time.process_time() - start
    start = time.process_time()
    for number in range(count):
        await store.append_event(StepEvent(run_id='floor', kind='run_started', step_index=number))
    event = time.process_time() - start
    print(
        f'\nper call, CPU µs: thread hop {hop / count * 1e6:.0f}; empty write transaction with its hop '
        f'{transaction / count * 1e6:.0f}; append_event {event / count * 1e6:.0f}'
    )


async def main(arguments: argparse.Namespace) -> None:
    executors._in_transaction = _profiled_transaction
    with tempfile.TemporaryDirectory() as directory:
        async with SqliteStepStore(Path(directory) / 'runs.db') as sqlite_store:
            store = {'sqlite': sqlite_store, 'memory': InMemoryStepStore(), 'none': None}[arguments.backend]

            def capabilities() -> list[Any]:
                return [] if store is None else [StepPersistence(store=store, agent_name='profile')]

            await run_agent(3, capabilities())
            global worker_profile
            worker_profile = cProfile.Profile()  # the warm-up run (schema creation) is left out
            profiler = Profiler(interval=0.0005)
            profiler.start()
            for _ in range(arguments.runs):
                await run_agent(arguments.steps, capabilities())
            profiler.stop()
            print(profiler.output_text(unicode=False, color=False, show_all=False))
            if arguments.backend == 'sqlite':
                print('Worker-thread transactions (cProfile, own time):')
                pstats.Stats(worker_profile).sort_stats('tottime').print_stats(25)
                await floor(sqlite_store)


if __name__ == '__main__':
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--backend', choices=['sqlite', 'memory', 'none'], default='sqlite')
    parser.add_argument('--steps', type=int, default=50)
    parser.add_argument('--runs', type=int, default=4)
    asyncio.run(main(parser.parse_args()))
