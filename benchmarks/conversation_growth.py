"""Issue 17's numbers: a chat's storage and per-turn cost as it grows, and conversation listings at scale.

    cd benchmarks && uv run python conversation_growth.py [--backends sqlite,postgres,file,mongo] [--rounds 3]

A chat turn is one run given the previous run's `all_messages()` (as a chat application keeps
it), with one tool call and a text answer (4 messages per turn). Per backend, on fresh stores:

- storage: bytes after 40 turns over bytes after 10 turns (linear growth is 4), and the message
  versions stored after 40 turns next to the distinct messages of the chat (160);
- overhead per turn (wall time with persistence minus the same turn without, medians over rounds
  that alternate the two) around turn 5 (turns 4-6) and around turn 40 (turns 38-40), and the same
  in CPU time (the steadier figure on a shared machine);
- `list_conversations(limit=20)` among `--conversations` conversations, and
  `list_runs(conversation_id=..., limit=20, newest_first=True)` in a conversation of
  `--conversation-runs` runs (median of 20 calls each).

Servers are started as `bench.py` starts them (the test suite's own code).
"""

from __future__ import annotations

import argparse
import asyncio
import sqlite3
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from bench import (
    Servers,
    StoreHandle,
    _directory_size,
    _mongo_size,
    _postgres_size,
    _sqlite_size,
    open_store,
    servers,
)
from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

import step_persistence as ours

TURNS = 40
TOOL_RESULT = 'lorem ipsum ' * 20


def chat_agent(capabilities: list[Any]) -> Agent[None, str]:
    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        last = messages[-1]
        assert isinstance(last, ModelRequest)
        if isinstance(last.parts[-1], ToolReturnPart):
            return ModelResponse(parts=[TextPart(f'answer {len(messages)}')])
        return ModelResponse(parts=[ToolCallPart('lookup', {'n': len(messages)}, f'call-{len(messages)}')])

    agent = Agent(FunctionModel(respond), capabilities=capabilities)

    @agent.tool_plain
    def lookup(n: int) -> str:
        return f'{n}: {TOOL_RESULT}'

    return agent


async def chat(agent: Agent[None, str], turns: int) -> list[tuple[float, float]]:
    """`(wall seconds, CPU seconds)` per turn of a `turns`-turn chat (CPU: `time.process_time`, the whole
    process, worker threads included)."""
    history: list[ModelMessage] = []
    times = []
    for turn in range(turns):
        started, cpu = time.perf_counter(), time.process_time()
        history = (await agent.run(f'question {turn}', message_history=history)).all_messages()
        times.append((time.perf_counter() - started, time.process_time() - cpu))
    return times


@dataclass
class Opened:
    """A fresh store of this library, its size in bytes, and its message versions counted in the storage."""

    handle: StoreHandle
    count_messages: Callable[[], Coroutine[Any, Any, int]]


async def open_counted(backend: str, root: Path, found: Servers) -> Opened:
    """A fresh store on `backend` (as `bench.open_store` makes them), with a count of its stored messages."""
    place = Path(tempfile.mkdtemp(prefix=f'chat-{backend}-', dir=root))
    if backend == 'sqlite':
        path = place / 'runs.db'
        sqlite_store = ours.SqliteStepStore(path)

        async def sqlite_count() -> int:
            connection = sqlite3.connect(path)
            try:
                return int(connection.execute('SELECT count(*) FROM messages').fetchone()[0])
            finally:
                connection.close()

        async def sqlite_size() -> int:
            return _sqlite_size(path)

        return Opened(StoreHandle(sqlite_store, sqlite_size, sqlite_store.aclose), sqlite_count)
    if backend == 'file':

        async def file_count() -> int:
            journals = place.rglob('messages.jsonl')  # noqa: ASYNC240 - measured after the run
            return sum(len(journal.read_bytes().splitlines()) for journal in journals)

        async def file_size() -> int:
            return _directory_size(place)

        async def nothing() -> None:
            return None

        return Opened(StoreHandle(ours.FileStepStore(place), file_size, nothing), file_count)
    if backend == 'postgres':
        import asyncpg

        url = found.postgres_url(await found.create_database())
        postgres_store = ours.PostgresStepStore(url)

        async def postgres_count() -> int:
            connection = await asyncpg.connect(url.replace('postgresql+asyncpg', 'postgresql'))
            try:
                return int(await connection.fetchval('SELECT count(*) FROM messages'))
            finally:
                await connection.close()

        async def postgres_size() -> int:
            return await _postgres_size(url)

        return Opened(StoreHandle(postgres_store, postgres_size, postgres_store.aclose), postgres_count)
    if backend == 'mongo':
        from pymongo import AsyncMongoClient

        uri = found.mongo_uri
        assert uri is not None
        database = f'chat_{uuid.uuid4().hex[:12]}'
        mongo_store = ours.MongoStepStore(db_url=uri, database=database)

        async def mongo_count() -> int:
            client: Any = AsyncMongoClient(uri)
            try:
                return int(await client[database]['messages'].count_documents({}))
            finally:
                await client.close()

        async def mongo_size() -> int:
            return await _mongo_size(uri, database)

        return Opened(StoreHandle(mongo_store, mongo_size, mongo_store.aclose), mongo_count)
    raise ValueError(backend)


async def growth(backend: str, root: Path, found: Servers, rounds: int) -> dict[str, float]:
    without: list[list[tuple[float, float]]] = []
    with_: list[list[tuple[float, float]]] = []
    sizes: dict[int, float] = {}
    versions = 0
    for _ in range(rounds):
        without.append(await chat(chat_agent([]), TURNS))
        opened = await open_counted(backend, root, found)
        handle = opened.handle
        try:
            with_.append(await chat(chat_agent([ours.StepPersistence(store=handle.store, agent_name='chat')]), TURNS))
            versions = await opened.count_messages()
            sizes[TURNS] = await handle.size()
        finally:
            await handle.close()
    short = await open_store('ours', backend, root, found)
    try:
        await chat(chat_agent([ours.StepPersistence(store=short.store, agent_name='chat')]), 10)
        sizes[10] = await short.size()
    finally:
        await short.close()

    def overhead(turns: range, clock: int) -> float:
        return statistics.median(
            statistics.median(run[turn][clock] for run in with_)
            - statistics.median(run[turn][clock] for run in without)
            for turn in turns
        )

    early, late = overhead(range(3, 6), 0), overhead(range(TURNS - 3, TURNS), 0)
    early_cpu, late_cpu = overhead(range(3, 6), 1), overhead(range(TURNS - 3, TURNS), 1)
    return {
        'bytes 40 / bytes 10': sizes[TURNS] / sizes[10],
        'message versions stored (40 turns)': versions,
        'distinct messages (40 turns)': 4 * TURNS,
        'overhead ms/turn around turn 5': early * 1e3,
        'overhead ms/turn around turn 40': late * 1e3,
        'turn 40 / turn 5': late / early,
        'CPU overhead ms/turn around turn 5': early_cpu * 1e3,
        'CPU overhead ms/turn around turn 40': late_cpu * 1e3,
        'CPU turn 40 / turn 5': late_cpu / early_cpu,
    }


async def timed(call: Callable[[], Coroutine[Any, Any, Any]], times: int = 20) -> float:
    spent = []
    for _ in range(times):
        started = time.perf_counter()
        await call()
        spent.append(time.perf_counter() - started)
    return statistics.median(spent) * 1e3


async def listings(
    backend: str, root: Path, found: Servers, conversations: int, conversation_runs: int
) -> dict[str, float]:
    handle = await open_store('ours', backend, root, found)
    store = handle.store
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    try:
        records = [
            ours.RunRecord(run_id=f'chat-{n}', conversation_id=f'conv-{n}', started_at=t0 + timedelta(seconds=n))
            for n in range(conversations)
        ]
        records += [
            ours.RunRecord(run_id=f'long-{n}', conversation_id='long', started_at=t0 + timedelta(seconds=n))
            for n in range(conversation_runs)
        ]
        for start in range(0, len(records), 50):
            await asyncio.gather(*(store.register_run(record) for record in records[start : start + 50]))
        newest = await store.list_conversations(limit=20)
        assert len(newest) == 20
        assert len(await store.list_runs(conversation_id='long', limit=20, newest_first=True)) == 20
        return {
            f'list_conversations(limit=20) among {conversations + 1} conversations, ms': await timed(
                lambda: store.list_conversations(limit=20)
            ),
            f'list_runs(conversation, limit=20, newest first) among {conversation_runs} runs, ms': await timed(
                lambda: store.list_runs(conversation_id='long', limit=20, newest_first=True)
            ),
        }
    finally:
        await handle.close()


async def measure(options: argparse.Namespace, found: Servers, root: Path) -> None:
    for backend in options.backends.split(','):
        figures = await growth(backend, root, found, options.rounds)
        many = options.conversations if backend != 'mongo' else options.mongo_conversations
        figures |= await listings(backend, root, found, many, options.conversation_runs)
        print(f'## {backend}')
        for name, value in figures.items():
            print(f'- {name}: {value:.2f}' if isinstance(value, float) else f'- {name}: {value}')
        print(flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--backends', default='sqlite,postgres,file,mongo')
    parser.add_argument('--rounds', type=int, default=3)
    parser.add_argument('--conversations', type=int, default=10_000)
    parser.add_argument('--mongo-conversations', type=int, default=1_000)
    parser.add_argument('--conversation-runs', type=int, default=1_000)
    options = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix='conversation-growth-'))
    backends = options.backends.split(',')
    with servers(root, postgres='postgres' in backends, mongo='mongo' in backends) as found:
        asyncio.run(measure(options, found, root))


if __name__ == '__main__':
    main()
