"""The file store's `list_runs` through its run index, against reading every run, in one run.

Registers `--runs` runs (10 per parent, two agents) in a fresh store (`fsync=False`), then times
each listing (median of 9, a fresh store object each time: nothing cached) with the run index,
and again after removing `@runs/complete`, which makes the store read every `run.json` (as a
directory written before the index does). Prints milliseconds and the ratio indexed / every run.

    cd benchmarks && uv run python file_list_runs.py --runs 20000
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from step_persistence import FileStepStore, RunRecord

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def listings(middle: int) -> dict[str, dict[str, Any]]:
    return {
        'newest 20': {'limit': 20, 'newest_first': True},
        'newest 20 of an agent': {'agent_name': 'a', 'limit': 20, 'newest_first': True},
        'a parent (10 runs)': {'parent_run_id': f'p{middle}'},
    }


async def _median_ms(directory: Path, options: dict[str, Any]) -> float:
    """The median time of `list_runs(**options)`, each on a fresh store object."""
    times = []
    for _ in range(9):
        store = FileStepStore(directory, fsync=False)
        started = time.perf_counter()
        await store.list_runs(**options)
        times.append(time.perf_counter() - started)
    return 1e3 * statistics.median(times)


async def main(runs: int) -> None:
    with tempfile.TemporaryDirectory() as name:
        directory = Path(name)
        store = FileStepStore(directory, fsync=False)
        for first in range(0, runs, 50):
            await asyncio.gather(
                *(
                    store.register_run(
                        RunRecord(
                            run_id=f'r{n}',
                            agent_name='ab'[n % 2],
                            parent_run_id=f'p{n // 10}',
                            started_at=T0 + timedelta(seconds=n),
                        )
                    )
                    for n in range(first, min(first + 50, runs))
                )
            )
        chosen = listings(runs // 20)
        indexed = {label: await _median_ms(directory, options) for label, options in chosen.items()}
        (directory / '@runs' / 'complete').unlink()
        every = {label: await _median_ms(directory, options) for label, options in chosen.items()}
    print(f'{runs} runs: list_runs ms, indexed / every run.json read')
    for label in chosen:
        print(f'| {label} | {indexed[label]:.2f} | {every[label]:.0f} | {indexed[label] / every[label]:.4f} |')


if __name__ == '__main__':
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--runs', type=int, default=20_000)
    asyncio.run(main(parser.parse_args().runs))
