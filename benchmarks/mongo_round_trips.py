"""Round trips a MongoDB store makes per agent tool step, by command and collection.

A scripted agent makes K sequential tool calls with `StepPersistence` on a `MongoStepStore` given
an application's pymongo client, whose command listener records every command sent. Starts a
throwaway SecantusDB server as the test suite does (tests/support/servers/mongo.py).

    cd benchmarks && uv run python mongo_round_trips.py [--steps 20] [--per-collection]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

from pydantic_ai import Agent
from pymongo import AsyncMongoClient, monitoring

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / 'tests'))

from bench import _TempPaths

from step_persistence import StepPersistence
from step_persistence.stores.mongo import MongoStepStore
from step_persistence.stores.mongo import _ordered_writes as ordered_writes
from support.scripted import calls, scripted, text
from support.servers.mongo import mongo_server


class Commands(monitoring.CommandListener):
    """Counts the commands a client sends, as `command collection`."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        self.counts[f'{event.command_name} {event.command.get(event.command_name)}'] += 1

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        pass

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        pass


async def count(uri: str, steps: int) -> Counter[str]:
    commands = Commands()
    client: AsyncMongoClient[Any] = AsyncMongoClient(uri, event_listeners=[commands])
    try:
        async with MongoStepStore(client=client, database='round_trips') as store:
            warm_up = scripted(calls(('lookup', {'step': -1})), text('warm'))
            agent = Agent(warm_up, capabilities=[StepPersistence(store=store)])

            @agent.tool_plain
            def lookup(step: int) -> str:
                return f'result {step}'

            await agent.run('warm up')
            commands.counts.clear()
            script = [calls(('lookup', {'step': step})) for step in range(steps)]
            agent = Agent(scripted(*script, text('done')), capabilities=[StepPersistence(store=store)])
            agent.tool_plain(lookup)
            await agent.run('go')
            counted = Counter(commands.counts)
    finally:
        await client.close()
    return counted


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--steps', type=int, default=20)
    parser.add_argument(
        '--per-collection',
        action='store_true',
        help='send each batch per collection, as on a server before MongoDB 8.0 (no client bulkWrite)',
    )
    arguments = parser.parse_args()
    steps = arguments.steps
    if arguments.per_collection:
        ordered_writes.CLIENT_BULK_WRITE_WIRE_VERSION = 10**6  # type: ignore[misc]
    with (
        tempfile.TemporaryDirectory() as root,
        contextlib.contextmanager(mongo_server.__wrapped__)(_TempPaths(Path(root))) as server,
    ):
        counts = asyncio.run(count(server.uri, steps))
    print('| command | per run | per step |\n|---|---:|---:|')
    for name, number in sorted(counts.items()):
        print(f'| {name} | {number} | {number / steps:.2f} |')
    total = sum(counts.values())
    print(f'| all round trips | {total} | {total / steps:.2f} |')


if __name__ == '__main__':
    main()
