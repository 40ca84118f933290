"""Fixtures and helpers shared by the Mongo-specific tests (import the fixtures into a test module to use them)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from pymongo import AsyncMongoClient, monitoring

from step_persistence import ContinuableSnapshot
from step_persistence.stores.mongo import MongoStepStore
from step_persistence.testing.conformance import sample_history
from support.servers.mongo import Driver, MongoServer, Scratch

__all__ = ['CommandLog', 'any_scratch', 'explain', 'scratch', 'snapshot', 'store_in', 'winning_stages']


@pytest.fixture
async def scratch(mongo_server: MongoServer) -> AsyncIterator[Scratch]:
    """A pymongo client for the test; the databases it hands out are dropped afterwards."""
    async with mongo_server.scratch('pymongo') as made:
        yield made


@pytest.fixture(params=['pymongo', 'motor'])
async def any_scratch(mongo_server: MongoServer, request: pytest.FixtureRequest) -> AsyncIterator[Scratch]:
    """Like `scratch`, once per driver."""
    driver: Driver = request.param
    async with mongo_server.scratch(driver) as made:
        yield made


def snapshot(run_id: str, turns: int, **fields: Any) -> ContinuableSnapshot:
    """A snapshot of `sample_history(turns)` (a prompt and `turns` tool cycles) at step `turns`."""
    return ContinuableSnapshot(run_id=run_id, step_index=turns, messages=sample_history(turns), **fields)


def store_in(scratch: Scratch, database: str | None = None, **options: Any) -> MongoStepStore:
    """A store on `database` (default: a fresh one) through the scratch client."""
    return MongoStepStore(client=scratch.client, database=database or scratch.fresh_database(), **options)


class CommandLog(monitoring.CommandListener):
    """Records the commands a client sends: `(command name, collection, command document)`."""

    def __init__(self) -> None:
        self.commands: list[tuple[str, Any, Any]] = []

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        self.commands.append((event.command_name, event.command.get(event.command_name), event.command))

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        pass

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        pass

    def named(self, name: str) -> list[Any]:
        """The collections targeted by the recorded `name` commands, in order."""
        return [collection for command, collection, _ in self.commands if command == name]

    def per_collection(self) -> list[tuple[str, Any]]:
        """`(command name, collection)` of every recorded command, a client-level `bulkWrite` counted as
        its operations (`insert`, `update` or `delete` on their collections)."""
        found: list[tuple[str, Any]] = []
        for name, collection, command in self.commands:
            if name != 'bulkWrite':
                found.append((name, collection))
                continue
            namespaces = [entry['ns'].split('.', 1)[1] for entry in command['nsInfo']]
            for operation in command['ops']:
                kind = next(kind for kind in ('insert', 'update', 'delete') if kind in operation)
                found.append((kind, namespaces[operation[kind]]))
        return found

    def client(self, uri: str) -> AsyncMongoClient[Any]:
        """A pymongo client whose commands this log records (close it after use)."""
        return AsyncMongoClient(uri, event_listeners=[self])


def winning_stages(explained: Any) -> list[tuple[str, str | None]]:
    """`(stage, index name)` of every stage of every winning plan in an `explain` answer."""
    found: list[tuple[str, str | None]] = []

    def stages(node: Any) -> None:
        if isinstance(node, dict):
            if 'stage' in node:
                found.append((node['stage'], node.get('indexName')))
            for value in node.values():
                stages(value)
        elif isinstance(node, list):
            for value in node:
                stages(value)

    def plans(node: Any) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key == 'winningPlan':
                    stages(value)
                elif key != 'rejectedPlans':
                    plans(value)
        elif isinstance(node, list):
            for value in node:
                plans(value)

    plans(explained)
    return found


async def explain(db: Any, command: dict[str, Any]) -> list[tuple[str, str | None]]:
    """The winning plan's stages of a command the store sent (as it sent it, minus session fields)."""
    sent = {
        key: value for key, value in command.items() if not key.startswith('$') and key not in ('lsid', 'txnNumber')
    }
    return winning_stages(await db.command('explain', sent, verbosity='queryPlanner'))
