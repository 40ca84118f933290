"""Where MongoDB's overhead per step goes as a run grows: this library's client, or the SecantusDB server.

    cd benchmarks && uv run python mongo_growth.py [--rounds 3] [--per-collection]

`bench.py` runs every K of a backend on one store, so by K=200 the SecantusDB database already
holds every earlier round's runs. This script gives each K-step run a fresh database on a fresh
SecantusDB server (started as `make bench` starts it) and prints, per step: the overhead over the
same agent without persistence (wall), this process's CPU, and the server process's CPU (from
`/proc`). The overhead per step at K=200 over K=10 is the growth `bench.py`'s target is about;
the server's CPU shows where the rest of the bench's figure comes from.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench import run_agent, servers

from step_persistence import MongoStepStore, StepPersistence
from step_persistence.stores.mongo import _ordered_writes as ordered_writes

TICKS_PER_SECOND = os.sysconf('SC_CLK_TCK')


def process_cpu(pid: int) -> float:
    """User plus system CPU seconds of process `pid` so far."""
    fields = Path(f'/proc/{pid}/stat').read_text().rsplit(')', 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS_PER_SECOND


def server_pid(uri: str) -> int:
    """The SecantusDB process listening on `uri`'s port."""
    port = urlsplit(uri).port
    found = subprocess.run(['pgrep', '-f', f'secantus.*--port {port}'], capture_output=True, text=True, check=True)
    return int(found.stdout.split()[0])


async def measure(uri: str, pid: int, rounds: int) -> None:
    per_step: dict[tuple[int, str], list[float]] = {}
    for _ in range(rounds):
        for steps in (10, 200):
            started = time.perf_counter()
            await run_agent(steps, [])
            per_step.setdefault((steps, 'without'), []).append((time.perf_counter() - started) / steps)
            store = MongoStepStore(db_url=uri, database=f'growth_{uuid.uuid4().hex[:12]}')
            await run_agent(2, [StepPersistence(store=store)])
            server, client, started = process_cpu(pid), time.process_time(), time.perf_counter()
            await run_agent(steps, [StepPersistence(store=store)])
            per_step.setdefault((steps, 'with'), []).append((time.perf_counter() - started) / steps)
            per_step.setdefault((steps, 'client CPU'), []).append((time.process_time() - client) / steps)
            per_step.setdefault((steps, 'server CPU'), []).append((process_cpu(pid) - server) / steps)
            await store.aclose()
    overhead: dict[int, float] = {}
    for steps in (10, 200):
        median = {
            kind: statistics.median(per_step[steps, kind]) * 1e3
            for kind in ('without', 'with', 'client CPU', 'server CPU')
        }
        overhead[steps] = median['with'] - median['without']
        print(
            f'K={steps}: overhead {overhead[steps]:.1f} ms/step wall; with persistence, client CPU '
            f'{median["client CPU"]:.1f} ms/step, server CPU {median["server CPU"]:.1f} ms/step'
        )
    print(f'overhead per step, K=200 / K=10: {overhead[200] / overhead[10]:.2f}')


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--rounds', type=int, default=3)
    parser.add_argument(
        '--per-collection',
        action='store_true',
        help='send each batch per collection, as on a server before MongoDB 8.0 (no client bulkWrite)',
    )
    arguments = parser.parse_args()
    if arguments.per_collection:
        ordered_writes.CLIENT_BULK_WRITE_WIRE_VERSION = 10**6  # type: ignore[misc]
    with servers(Path(tempfile.mkdtemp(prefix='mongo-growth-')), postgres=False, mongo=True) as found:
        assert found.mongo_uri is not None
        asyncio.run(measure(found.mongo_uri, server_pid(found.mongo_uri), arguments.rounds))


if __name__ == '__main__':
    main()
