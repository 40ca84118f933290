"""A SQLite `write_batch` on its own: the driver path (`Prepared`) against Core, alternating.

    cd benchmarks && uv run python replay_batches.py [--rounds 16]

Records the flushes of one real K=50 agent run (`bench.lookup_agent` with `StepPersistence` on
an in-memory store), then replays those batches into one SQLite store under fresh run ids, round
after round, alternating the driver path with Core (every `Prepared` statement declined), and
prints the median wall and CPU time per batch of each (the first two rounds are a warm-up).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench import run_agent

from step_persistence import InMemoryStepStore, SqliteStepStore, StepPersistence
from step_persistence.records import StepWrites
from step_persistence.stores.sql.prepared import Prepared


class RecordingStore(InMemoryStepStore):
    """An in-memory store that keeps every batch the capability flushes."""

    def __init__(self) -> None:
        super().__init__()
        self.batches: list[StepWrites] = []

    async def write_batch(self, writes: StepWrites) -> None:
        self.batches.append(writes)
        await super().write_batch(writes)


def renamed(writes: StepWrites, suffix: str) -> StepWrites:
    """`writes` for the runs `<run_id>-<suffix>`."""

    def rename(record: Any) -> Any:
        return record.model_copy(update={'run_id': f'{record.run_id}-{suffix}'})

    return StepWrites(
        tool_effects=[rename(effect) for effect in writes.tool_effects],
        events=[rename(event) for event in writes.events],
        snapshots=[rename(snapshot) for snapshot in writes.snapshots],
    )


async def main(rounds: int) -> None:
    recording = RecordingStore()
    await run_agent(50, [StepPersistence(store=recording, agent_name='replay')])
    runs = await recording.list_runs()
    driver_path = Prepared.run
    timings: dict[str, list[tuple[float, float]]] = {'driver': [], 'core': []}
    with tempfile.TemporaryDirectory() as directory:
        async with SqliteStepStore(Path(directory) / 'runs.db') as store:
            for number in range(rounds + 2):
                mode = 'driver' if number % 2 else 'core'
                Prepared.run = driver_path if mode == 'driver' else (lambda *arguments: None)  # type: ignore[method-assign]
                for run in runs:
                    await store.register_run(run.model_copy(update={'run_id': f'{run.run_id}-{number}'}))
                batches = [renamed(writes, str(number)) for writes in recording.batches]
                wall, cpu = time.perf_counter(), time.process_time()
                for writes in batches:
                    await store.write_batch(writes)
                if number >= 2:
                    count = len(batches)
                    timings[mode].append(((time.perf_counter() - wall) / count, (time.process_time() - cpu) / count))
    Prepared.run = driver_path  # type: ignore[method-assign]
    print(f'{len(recording.batches)} batches per round, {rounds} rounds')
    for mode, found in timings.items():
        wall_us = statistics.median(each[0] for each in found) * 1e6
        cpu_us = statistics.median(each[1] for each in found) * 1e6
        print(f'{mode}: write_batch {wall_us:.0f} µs wall, {cpu_us:.0f} µs CPU (median per batch)')


if __name__ == '__main__':
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--rounds', type=int, default=16)
    asyncio.run(main(parser.parse_args().rounds))
