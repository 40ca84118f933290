"""The capability's own CPU per step: `StepPersistence` on the memory store, next to the bare agent.

    cd benchmarks && uv run python capability_cost.py [--steps 10 50 200] [--rounds 9]
                                                       [--compare BEFORE_SRC AFTER_SRC [--processes 4]]
                                                       [--profile K] [--backend memory|sqlite|postgres]
                                                       [--clock cpu|wall]

`--backend postgres`: on one `PostgresStepStore` (its own engine, on a throwaway cluster as `make
bench` starts) for every run instead, so the figure is the capability and the store together;
`--backend sqlite`: on one `SqliteStepStore` (a file in a temporary directory), likewise.
`--clock wall`: wall time instead of CPU (the with/without ratio is of medians on that clock).

The agent is `bench.lookup_agent` (a FunctionModel calling one tool per step, K times, then
answering). A round runs, for each K, the agent without capabilities and with
`StepPersistence(store=InMemoryStepStore())`, alternating, and takes each run's CPU time
(`time.process_time`, after a `gc.collect()` outside the timed span). The overhead per step is
(with - without) / K, given from the minimum and from the median of the rounds' times.

`--compare BEFORE_SRC AFTER_SRC`: two source trees of the library (say `git archive <commit> src`
unpacked for the commit before a change and for the change), measured alternately in `--processes`
child processes each (before, after, before, ...), each child doing `--rounds` rounds after a
warm-up. Each child's overheads are computed within it (its bare agent and its capability ran
side by side); a tree's figure is the median over its children, with their range. Both trees run
on this environment's pydantic-ai.

`--instrument`: every agent instrumented (`Agent.instrument_all()`) with no OpenTelemetry SDK set up,
so pydantic-ai's spans come from OpenTelemetry's no-op tracer, as for an application without an SDK.

`--profile K`: a cProfile of 20 runs of K steps with the capability, by own time, then by
cumulative time (the bare agent's own functions are in it too: compare with `--profile-bare`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import gc
import json
import os
import pstats
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


@contextlib.asynccontextmanager
async def _store(backend: str) -> AsyncIterator[Callable[[], Any]]:
    """What each run's capability writes to: a new memory store per run, or one SQLite or PostgreSQL store for all."""
    from step_persistence import InMemoryStepStore, PostgresStepStore, SqliteStepStore

    if backend == 'memory':
        yield InMemoryStepStore
        return
    if backend == 'sqlite':
        with tempfile.TemporaryDirectory() as root:
            async with SqliteStepStore(Path(root) / 'runs.db') as store:
                yield lambda: store
        return
    from bench import servers

    with tempfile.TemporaryDirectory() as root, servers(Path(root), postgres=True, mongo=False) as found:
        async with PostgresStepStore(found.postgres_url(await found.create_database())) as store:
            yield lambda: store


def _measure(steps_list: list[int], rounds: int, backend: str, clock: str = 'cpu') -> dict[str, dict[str, list[float]]]:
    """Seconds of each run on `clock` (process CPU or wall): `{str(K): {'none': [...], 'with': [...]}}`."""
    from bench import run_agent

    from step_persistence import StepPersistence

    async def timed(steps: int, capabilities: Callable[[], list[Any]]) -> float:
        now = time.process_time if clock == 'cpu' else time.perf_counter
        gc.collect()
        started = now()
        await run_agent(steps, capabilities())
        return now() - started

    async def main() -> dict[str, dict[str, list[float]]]:
        async with _store(backend) as store:

            def capability() -> list[Any]:
                return [StepPersistence(store=store(), agent_name='bench')]

            for _ in range(3):  # warm-up: adapters, validators, caches (and the store's tables and connections)
                await run_agent(5, [])
                await run_agent(5, capability())
            found: dict[str, dict[str, list[float]]] = {str(k): {'none': [], 'with': []} for k in steps_list}
            for _ in range(rounds):
                for steps in steps_list:
                    found[str(steps)]['none'].append(await timed(steps, list))
                    found[str(steps)]['with'].append(await timed(steps, capability))
            return found

    return asyncio.run(main())


def _overheads(times: dict[str, list[float]], steps: int) -> tuple[float, float]:
    """Overhead per step in ms (of the clock measured): from the minima, and from the medians."""
    low = (min(times['with']) - min(times['none'])) * 1e3 / steps
    middle = (statistics.median(times['with']) - statistics.median(times['none'])) * 1e3 / steps
    return low, middle


def _report(label: str, found: dict[str, dict[str, list[float]]]) -> None:
    for key, times in found.items():
        steps = int(key)
        low, middle = _overheads(times, steps)
        bare = min(times['none']) * 1e3 / steps
        ratio = statistics.median(times['with']) / statistics.median(times['none'])
        print(
            f'{label} K={steps}: overhead ms/step min {low:.3f} median {middle:.3f}, with/without {ratio:.2f} '
            f'(bare agent {bare:.2f} ms/step; {len(times["with"])} rounds)',
            flush=True,
        )


def _compare(arguments: argparse.Namespace) -> None:
    """Children alternate between the trees; each child's overheads are computed within it, then summarized."""
    by_source: dict[str, dict[int, list[tuple[float, float]]]] = {source: {} for source in arguments.compare}
    for _ in range(arguments.processes):
        for source in arguments.compare:
            environment = {**os.environ, 'PYTHONPATH': os.pathsep.join([source, str(HERE)])}
            command = [sys.executable, __file__, '--child', '--rounds', str(arguments.rounds)]
            command += ['--backend', arguments.backend, '--clock', arguments.clock]
            command += ['--instrument'] if arguments.instrument else []
            command += ['--steps']
            output = subprocess.run(
                [*command, *map(str, arguments.steps)], env=environment, check=True, capture_output=True, text=True
            ).stdout
            child = json.loads(output.splitlines()[-1])
            for key, times in child.items():
                by_source[source].setdefault(int(key), []).append(_overheads(times, int(key)))
            _report(f'{source} (one process)', child)
    for source, found in by_source.items():
        for steps, overheads in found.items():
            lows, middles = [low for low, _ in overheads], [middle for _, middle in overheads]
            print(
                f'{source} K={steps}: overhead ms/step ({arguments.clock}), '
                f"median over {len(overheads)} processes of each one's "
                f'min {statistics.median(lows):.3f} (from {min(lows):.3f} to {max(lows):.3f}), '
                f'median {statistics.median(middles):.3f} (from {min(middles):.3f} to {max(middles):.3f})',
                flush=True,
            )


def _profile(steps: int, bare: bool) -> None:
    from bench import run_agent

    from step_persistence import InMemoryStepStore, StepPersistence

    def capabilities() -> list[Any]:
        return [] if bare else [StepPersistence(store=InMemoryStepStore(), agent_name='bench')]

    async def main() -> None:
        for _ in range(3):
            await run_agent(5, capabilities())
        profile = cProfile.Profile(time.process_time)
        profile.enable()
        for _ in range(20):
            await run_agent(steps, capabilities())
        profile.disable()
        stats = pstats.Stats(profile)
        stats.sort_stats('tottime').print_stats(40)
        stats.sort_stats('cumulative').print_stats(60)

    asyncio.run(main())


if __name__ == '__main__':
    sys.path.insert(0, str(HERE))
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--steps', type=int, nargs='+', default=[10, 50, 200])
    parser.add_argument('--rounds', type=int, default=9)
    parser.add_argument('--compare', nargs=2, metavar=('BEFORE_SRC', 'AFTER_SRC'))
    parser.add_argument('--processes', type=int, default=4, help='child processes per source tree (--compare)')
    parser.add_argument('--profile', type=int, metavar='K', help='profile 20 runs of K steps instead of measuring')
    parser.add_argument('--profile-bare', action='store_true', help='with --profile: the agent without capabilities')
    parser.add_argument('--instrument', action='store_true', help='instrument every agent, with no OpenTelemetry SDK')
    parser.add_argument(
        '--backend', choices=['memory', 'sqlite', 'postgres'], default='memory', help='the store written to'
    )
    parser.add_argument('--clock', choices=['cpu', 'wall'], default='cpu')
    parser.add_argument('--child', action='store_true', help=argparse.SUPPRESS)
    arguments = parser.parse_args()
    if arguments.instrument:
        from pydantic_ai import Agent

        Agent.instrument_all(True)
    if arguments.profile is not None:
        _profile(arguments.profile, arguments.profile_bare)
    elif arguments.compare:
        _compare(arguments)
    elif arguments.child:
        print(json.dumps(_measure(arguments.steps, arguments.rounds, arguments.backend, arguments.clock)))
    else:
        _report('step-persistence', _measure(arguments.steps, arguments.rounds, arguments.backend, arguments.clock))
