"""Issue 8's benchmarks: step-persistence next to pydantic-ai-harness, same run, same pydantic-ai.

Run from the repository root with `make bench` (or `cd benchmarks && uv run python bench.py`).
It starts its own PostgreSQL cluster and SecantusDB (MongoDB wire) server the way the test
suite does (tests/support/servers), measures, and writes `benchmarks/RESULTS.md`.

The comparator, `pydantic-ai-harness`, is used as a black box: its capability built from its
stores, and its stores' public methods, nothing else. Both libraries run in the same process, on
the same pydantic-ai (the version the comparator pins), on fresh stores of the same backends.
Each backend is measured in a Python process of its own (a child of this one, with only the
server that backend needs), so no backend runs in a process grown by the ones before it.

Every time is a median over rounds that interleave the configurations (none / ours / theirs), so
machine load affects them alike. Wall time is `time.perf_counter`, CPU time is
`time.process_time` (the whole process: the event loop and the stores' worker threads); on a
loaded 2-core machine the CPU column is the steadier one.

`--control` runs the same measurements with this library on both sides (the 'theirs' columns are
step-persistence again, on stores of its own), and writes RESULTS.md only if `--output` is given: its
ratios, which should be near 1, show that the interleaving and the medians favour neither side.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.metadata
import os
import pickle
import platform
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
import uuid
import warnings
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

warnings.filterwarnings('ignore')

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / 'tests'))

from pydantic_ai import Agent  # noqa: E402
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, ToolCallPart, ToolReturnPart  # noqa: E402
from pydantic_ai.usage import UsageLimits  # noqa: E402

import step_persistence as ours  # noqa: E402
from support.scripted import calls, scripted, text  # noqa: E402

theirs: Any = None
with contextlib.suppress(ImportError):  # the benchmark environment has it
    import pydantic_ai_harness.step_persistence as theirs  # type: ignore[no-redef]

CONTROL = False
"""`--control`: the comparator's side ('theirs') is this library again, on stores of its own, to show the
comparison is fair (its ratios to 'ours' should be about 1)."""


def _is_ours(library: str) -> bool:
    """Whether `library`'s side of the run is step-persistence (always, in a control run)."""
    return library == 'ours' or CONTROL


BACKENDS = ('memory', 'file', 'sqlite', 'postgres', 'mongo')
DURABLE = ('file', 'sqlite', 'postgres', 'mongo')
LIBRARIES = ('ours', 'theirs')
TOOL_RESULT = 'lorem ipsum ' * 20


# --- servers ---


class _TempPaths:
    """The one method of pytest's `tmp_path_factory` that tests/support/servers/mongo.py uses."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def mktemp(self, name: str) -> Path:
        path = Path(tempfile.mkdtemp(prefix=name, dir=self.root))
        return path


@dataclass
class Servers:
    postgres_port: int | None = None
    mongo_uri: str | None = None
    postgres_version: str = 'n/a'
    mongo_version: str = 'n/a'

    def postgres_url(self, database: str, driver: str = 'asyncpg') -> str:
        return f'postgresql+{driver}://postgres@127.0.0.1:{self.postgres_port}/{database}'

    async def create_database(self) -> str:
        import asyncpg

        name = f'bench_{uuid.uuid4().hex[:12]}'
        connection = await asyncpg.connect(host='127.0.0.1', port=self.postgres_port, user='postgres')
        try:
            await connection.execute(f'CREATE DATABASE {name}')
        finally:
            await connection.close()
        return name


@contextlib.contextmanager
def servers(root: Path, *, postgres: bool, mongo: bool) -> Iterator[Servers]:
    found = Servers()
    with contextlib.ExitStack() as stack:
        if postgres:
            from support.servers.postgres import postgres_server

            server = stack.enter_context(contextlib.contextmanager(postgres_server.__wrapped__)())
            found.postgres_port = server.port
        if mongo:
            from support.servers.mongo import mongo_server

            mongo_server_ = stack.enter_context(contextlib.contextmanager(mongo_server.__wrapped__)(_TempPaths(root)))
            found.mongo_uri = mongo_server_.uri
        yield found


# --- stores of both libraries ---


@dataclass
class StoreHandle:
    """A store of one library on one backend, and how to measure its size and close it."""

    store: Any
    size: Callable[[], Awaitable[int]]
    close: Callable[[], Awaitable[None]]


async def _postgres_size(url: str) -> int:
    import asyncpg

    connection = await asyncpg.connect(url.replace('postgresql+asyncpg', 'postgresql'))
    try:
        await connection.execute('VACUUM')
        value = await connection.fetchval(
            'SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c '
            "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.relkind IN ('r', 'm') "
            "AND n.nspname NOT IN ('pg_catalog', 'information_schema') AND n.nspname NOT LIKE 'pg_toast%'"
        )
        return int(value)
    finally:
        await connection.close()


async def _mongo_size(uri: str, database: str) -> int:
    """BSON bytes of every document of the database (the engine's own file sizes are not comparable)."""
    import bson
    from pymongo import AsyncMongoClient

    client: Any = AsyncMongoClient(uri)
    try:
        db = client[database]
        total = 0
        for name in await db.list_collection_names():
            async for document in db[name].find({}):
                total += len(bson.encode(document))
        return total
    finally:
        await client.close()


def _directory_size(path: Path) -> int:
    return sum(file.stat().st_size for file in path.rglob('*') if file.is_file())


def _sqlite_size(path: Path) -> int:
    """Bytes in use in the database file once its WAL is checkpointed (free pages not counted)."""
    connection = sqlite3.connect(path)
    try:
        connection.execute('PRAGMA wal_checkpoint(TRUNCATE)')
        page_size = connection.execute('PRAGMA page_size').fetchone()[0]
        pages = connection.execute('PRAGMA page_count').fetchone()[0]
        free = connection.execute('PRAGMA freelist_count').fetchone()[0]
        return int((pages - free) * page_size)
    finally:
        connection.close()


async def open_store(library: str, backend: str, root: Path, found: Servers) -> StoreHandle:
    """A fresh, empty store (a new directory, file or database)."""
    place = Path(tempfile.mkdtemp(prefix=f'{library}-{backend}-', dir=root))

    async def nothing() -> None:
        return None

    async def no_size() -> int:
        return 0

    if backend == 'memory':
        store = ours.InMemoryStepStore() if _is_ours(library) else theirs.InMemoryStepStore()
        return StoreHandle(store, no_size, nothing)
    if backend == 'file':
        store = ours.FileStepStore(place) if _is_ours(library) else theirs.FileStepStore(place)

        async def file_size() -> int:
            return _directory_size(place)

        return StoreHandle(store, file_size, nothing)
    if backend == 'sqlite':
        path = place / 'runs.db'
        store = ours.SqliteStepStore(path) if _is_ours(library) else theirs.SqliteStepStore(database=path)

        async def sqlite_size() -> int:
            return _sqlite_size(path)

        close = getattr(store, 'aclose', None) or nothing
        return StoreHandle(store, sqlite_size, close)
    if backend == 'postgres':
        name = await found.create_database()
        url = found.postgres_url(name)
        if _is_ours(library):
            store = ours.PostgresStepStore(url)
            close = store.aclose
        else:
            import asyncpg

            pool = await asyncpg.create_pool(url.replace('postgresql+asyncpg', 'postgresql'), min_size=1, max_size=10)
            store = theirs.PostgresStepStore(pool)
            close = pool.close

        async def postgres_size() -> int:
            return await _postgres_size(url)

        return StoreHandle(store, postgres_size, close)
    if backend == 'mongo':
        assert found.mongo_uri is not None
        database = f'bench_{uuid.uuid4().hex[:12]}'
        cls = ours.MongoStepStore if _is_ours(library) else theirs.MongoStepStore
        store = cls(db_url=found.mongo_uri, database=database)

        async def mongo_size() -> int:
            assert found.mongo_uri is not None
            return await _mongo_size(found.mongo_uri, database)

        return StoreHandle(store, mongo_size, store.aclose)
    raise ValueError(backend)


def capability(library: str, store: Any) -> Any:
    if _is_ours(library):
        return ours.StepPersistence(store=store, agent_name='bench')
    return theirs.StepPersistence(store=store, agent_name='bench')


# --- timing ---


@dataclass
class Clock:
    wall: list[float] = field(default_factory=list[float])
    cpu: list[float] = field(default_factory=list[float])

    @property
    def median_wall(self) -> float:
        return statistics.median(self.wall)

    @property
    def median_cpu(self) -> float:
        return statistics.median(self.cpu)


@contextlib.contextmanager
def clocked(clock: Clock) -> Iterator[None]:
    wall, cpu = time.perf_counter(), time.process_time()
    yield
    clock.wall.append(time.perf_counter() - wall)
    clock.cpu.append(time.process_time() - cpu)


# --- agents ---


def lookup_agent(steps: int, capabilities: list[Any]) -> Agent[None, str]:
    """A FunctionModel agent that calls one tool per step, `steps` times, then answers."""

    def respond(history: list[ModelMessage]) -> ModelResponse:
        step = sum(isinstance(message, ModelResponse) for message in history)
        return calls(('lookup', {'step': step}, f'call-{step}')) if step < steps else text('done')

    agent = Agent(scripted(respond), capabilities=capabilities)

    @agent.tool_plain
    def lookup(step: int) -> str:
        return f'{step}: {TOOL_RESULT}'

    return agent


async def run_agent(steps: int, capabilities: list[Any]) -> None:
    result = await lookup_agent(steps, capabilities).run('start', usage_limits=UsageLimits(request_limit=None))
    assert result.output == 'done'


# --- 1. agent overhead ---


@dataclass
class Overhead:
    backend: str
    steps: int
    none: Clock
    runs: dict[str, Clock]
    errors: dict[str, str] = field(default_factory=dict[str, str])

    def per_step(self, library: str, kind: str) -> float | None:
        """Overhead per step in ms (`kind`: 'wall' or 'cpu')."""
        clock = self.runs.get(library)
        if clock is None or not clock.wall:
            return None
        if kind == 'wall':
            return (clock.median_wall - self.none.median_wall) * 1e3 / self.steps
        return (clock.median_cpu - self.none.median_cpu) * 1e3 / self.steps

    def ratio(self, library: str) -> float | None:
        clock = self.runs.get(library)
        if clock is None or not clock.wall:
            return None
        return clock.median_wall / self.none.median_wall


async def agent_overhead(
    backends: list[str], steps_list: list[int], rounds: int, budget: float, root: Path, found: Servers
) -> list[Overhead]:
    results: list[Overhead] = []
    for backend in backends:
        handles = {library: await open_store(library, backend, root, found) for library in LIBRARIES}
        try:
            for library, handle in handles.items():  # warm up: schema creation, connections, imports
                with contextlib.suppress(Exception):
                    await run_agent(3, [capability(library, handle.store)])
            for steps in steps_list:
                result = Overhead(backend, steps, Clock(), {library: Clock() for library in LIBRARIES})
                for _ in range(rounds if steps < 200 else max(3, rounds // 2)):
                    with clocked(result.none):
                        await run_agent(steps, [])
                    for library, handle in handles.items():
                        if library in result.errors or sum(result.runs[library].wall) > budget:
                            continue  # a slow configuration keeps the rounds it has (at least one)
                        try:
                            with clocked(result.runs[library]):
                                await run_agent(steps, [capability(library, handle.store)])
                        except Exception as error:  # reported, not fatal: the table says what failed
                            result.errors[library] = f'{type(error).__name__}: {error}'[:200]
                            traceback.print_exc()
                results.append(result)
                print(
                    f'overhead {backend} K={steps}: ours {result.per_step("ours", "wall")} '
                    f'theirs {result.per_step("theirs", "wall")} ms/step',
                    flush=True,
                )
        finally:
            for handle in handles.values():
                await handle.close()
    return results


# --- 2. storage ---


async def storage(
    backends: list[str], steps_list: list[int], seconds_allowed: float, root: Path, found: Servers
) -> dict[tuple[str, str, int], int | str]:
    """Bytes after one K-step run on a fresh store (a run taking over `seconds_allowed` is cut off)."""
    sizes: dict[tuple[str, str, int], int | str] = {}
    for backend in backends:
        for library in LIBRARIES:
            for steps in steps_list:
                handle = await open_store(library, backend, root, found)
                try:
                    await asyncio.wait_for(run_agent(steps, [capability(library, handle.store)]), seconds_allowed)
                    await handle.close()
                    sizes[backend, library, steps] = await handle.size()
                except TimeoutError:
                    sizes[backend, library, steps] = f'run > {seconds_allowed:.0f} s'
                    await handle.close()
                except Exception as error:
                    sizes[backend, library, steps] = f'{type(error).__name__}'
                    traceback.print_exc()
                print(f'storage {backend} {library} K={steps}: {sizes[backend, library, steps]}', flush=True)
    return sizes


# --- 3. concurrency ---


@dataclass
class Throughput:
    backend: str
    agents: int
    steps: int
    seconds: dict[str, float] = field(default_factory=dict[str, float])
    cpu: dict[str, float] = field(default_factory=dict[str, float])
    errors: dict[str, int] = field(default_factory=dict[str, int])
    first_error: dict[str, str] = field(default_factory=dict[str, str])
    timed_out: set[str] = field(default_factory=set[str])
    """Configurations whose runs did not finish in time: their throughput is at most the figure shown."""

    def steps_per_second(self, name: str) -> float | None:
        seconds = self.seconds.get(name)
        return None if seconds is None else self.agents * self.steps / seconds

    def ratio(self, name: str) -> float | None:
        with_, without = self.steps_per_second(name), self.steps_per_second('none')
        return None if with_ is None or without is None else with_ / without


class _TimedOut:
    """What `_gather_within` gives back when the runs did not finish in time (they are cancelled)."""


async def _gather_within(seconds_allowed: float, *runs: Awaitable[Any], return_exceptions: bool = True) -> list[Any]:
    try:
        return list(await asyncio.wait_for(asyncio.gather(*runs, return_exceptions=return_exceptions), seconds_allowed))
    except TimeoutError:
        return [_TimedOut()]


async def concurrency(
    backends: list[str], agents: int, steps: int, rounds: int, budget: float, root: Path, found: Servers
) -> list[Throughput]:
    timeout = 3 * budget
    results = []
    for backend in backends:
        result = Throughput(backend, agents, steps)
        walls: dict[str, list[float]] = {'none': [], 'ours': [], 'theirs': []}
        cpus: dict[str, list[float]] = {'none': [], 'ours': [], 'theirs': []}
        handles = {library: await open_store(library, backend, root, found) for library in LIBRARIES}
        try:
            for library, handle in handles.items():
                with contextlib.suppress(Exception):
                    await run_agent(2, [capability(library, handle.store)])
            for _ in range(rounds):
                for name in ('none', *LIBRARIES):
                    if sum(walls[name]) > budget:
                        continue  # a slow configuration keeps the rounds it has (at least one)
                    handle = handles.get(name)
                    outcomes: list[Any] = []
                    wall, cpu = time.perf_counter(), time.process_time()
                    outcomes = await _gather_within(
                        timeout,
                        *(
                            run_agent(steps, [] if handle is None else [capability(name, handle.store)])
                            for _ in range(agents)
                        ),
                        return_exceptions=True,
                    )
                    walls[name].append(time.perf_counter() - wall)
                    cpus[name].append(time.process_time() - cpu)
                    if any(isinstance(outcome, _TimedOut) for outcome in outcomes):
                        result.timed_out.add(name)
                        result.first_error.setdefault(name, f'did not finish within {timeout:.0f} s (cancelled)')
                    failures = [outcome for outcome in outcomes if isinstance(outcome, BaseException)]
                    result.errors[name] = result.errors.get(name, 0) + len(failures)
                    if failures and name not in result.first_error:
                        result.first_error[name] = f'{type(failures[0]).__name__}: {failures[0]}'[:200]
            for name in walls:
                result.seconds[name] = statistics.median(walls[name])
                result.cpu[name] = statistics.median(cpus[name])
        finally:
            for handle in handles.values():
                await handle.close()
        print(f'concurrency {backend}: {result}', flush=True)
        results.append(result)
    return results


# --- 4. store operations ---


class Records:
    """Builds records with one library's record classes."""

    def __init__(self, module: Any) -> None:
        self.m = module

    def run(self, run_id: str, **fields: Any) -> Any:
        return self.m.RunRecord(run_id=run_id, **fields)

    def event(self, run_id: str, number: int) -> Any:
        return self.m.StepEvent(
            run_id=run_id, kind='tool_call_started', step_index=number, tool_call_id=f'c{number}', tool_name='lookup'
        )

    def effect(self, run_id: str, number: int, status: str) -> Any:
        return self.m.ToolEffectRecord(run_id=run_id, tool_call_id=f'c{number}', tool_name='lookup', status=status)

    def snapshot(self, run_id: str, number: int, messages: list[ModelMessage]) -> Any:
        return self.m.ContinuableSnapshot(run_id=run_id, step_index=number, messages=messages)


def growing_history(steps: int) -> list[list[ModelMessage]]:
    """The histories of a run that adds a tool call and its return per step (shared message objects)."""
    messages: list[ModelMessage] = [ModelRequest.user_text_prompt('start')]
    histories = []
    for step in range(steps):
        call_id = f'call-{step}'
        messages.append(ModelResponse(parts=[ToolCallPart('lookup', {'step': step}, call_id)]))
        messages.append(ModelRequest(parts=[ToolReturnPart('lookup', f'{step}: {TOOL_RESULT}', call_id)]))
        histories.append(list(messages))
    return histories


@dataclass
class StoreOps:
    backend: str
    library: str
    figures: dict[str, float | str] = field(default_factory=dict[str, float | str])


async def _rate(count: int, operation: Callable[[int], Awaitable[Any]], budget: float) -> float:
    """Operations per second over `count` calls, or over those made within `budget` seconds."""
    start = time.perf_counter()
    done = 0
    while done < count and (not done or time.perf_counter() - start < budget):
        await operation(done)
        done += 1
    return done / (time.perf_counter() - start)


async def _median_seconds(repeat: int, operation: Callable[[], Awaitable[Any]]) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        await operation()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


async def store_operations(
    backends: list[str],
    ops: int,
    many_runs: int,
    many_snapshots: int,
    budget: float,
    runs_budget: float,
    root: Path,
    found: Servers,
) -> list[StoreOps]:
    results = []
    for backend in backends:
        for library in LIBRARIES:
            result = await _store_operations_of(
                library, backend, ops, many_runs, many_snapshots, budget, runs_budget, root, found
            )
            print(f'store ops {backend} {library}: {result.figures}', flush=True)
            results.append(result)
    return results


async def _store_operations_of(
    library: str,
    backend: str,
    ops: int,
    many_runs: int,
    many_snapshots: int,
    budget: float,
    runs_budget: float,
    root: Path,
    found: Servers,
) -> StoreOps:
    records = Records(ours if _is_ours(library) else theirs)
    result = StoreOps(backend, library)
    handle = await open_store(library, backend, root, found)
    store = handle.store
    try:
        await store.register_run(records.run('ops'))
        result.figures['events/s'] = await _rate(ops, lambda n: store.append_event(records.event('ops', n)), budget)
        result.figures['effects/s'] = await _rate(
            ops,
            lambda n: store.record_tool_effect(records.effect('ops', n // 2, ('started', 'completed')[n % 2])),
            budget,
        )
        await store.register_run(records.run('snapshots'))
        histories = growing_history(min(ops, 500))
        result.figures['snapshots/s'] = await _rate(
            len(histories),
            lambda n: store.save_snapshot(records.snapshot('snapshots', n, histories[n])),
            budget,
        )
        # list_runs among many runs: 10 runs per conversation, one parent per 10 runs, registered
        # 50 at a time (as 50 agents starting together would).
        registered = time.perf_counter()
        batch = 50
        run_count = many_runs
        for first in range(0, many_runs, batch):
            if first and time.perf_counter() - registered > runs_budget:
                run_count = first  # the store's registration is too slow for the budget: fewer runs
                break
            await asyncio.gather(
                *(
                    store.register_run(
                        records.run(f'r{n}', conversation_id=f'conv{n // 10}', parent_run_id=f'p{n // 10}')
                    )
                    for n in range(first, min(first + batch, many_runs))
                )
            )
        result.figures['register_run/s'] = run_count / (time.perf_counter() - registered)
        result.figures['runs'] = str(run_count)
        middle = run_count // 20
        found_runs = await store.list_runs(conversation_id=f'conv{middle}')
        assert len(found_runs) == 10, len(found_runs)
        result.figures['list_runs(conversation) ms'] = 1e3 * await _median_seconds(
            9, lambda: store.list_runs(conversation_id=f'conv{middle}')
        )
        result.figures['list_runs(parent) ms'] = 1e3 * await _median_seconds(
            9, lambda: store.list_runs(parent_run_id=f'p{middle}')
        )
        # latest_snapshot among many snapshots of one run (a constant 3-message history).
        await store.register_run(records.run('many-snapshots'))
        small = histories[0]
        saved = time.perf_counter()
        saved_count = many_snapshots
        for number in range(many_snapshots):
            if number and time.perf_counter() - saved > budget:
                saved_count = number
                break
            await store.save_snapshot(records.snapshot('many-snapshots', number, small))
        result.figures['snapshots/s (constant history)'] = saved_count / (time.perf_counter() - saved)
        result.figures['snapshots'] = str(saved_count)
        latest = await store.latest_snapshot(run_id='many-snapshots')
        assert latest is not None and latest.step_index == saved_count - 1
        result.figures['latest_snapshot ms'] = 1e3 * await _median_seconds(
            9, lambda: store.latest_snapshot(run_id='many-snapshots')
        )
    except Exception as error:
        result.figures['error'] = f'{type(error).__name__}: {error}'[:200]
        traceback.print_exc()
    finally:
        await handle.close()
    return result


# --- report ---


def _fmt(value: float | None, digits: int = 2) -> str:
    return 'n/a' if value is None else f'{value:,.{digits}f}'


def _version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return 'not installed'


async def server_versions(found: Servers) -> None:
    if found.postgres_port is not None:
        import asyncpg

        connection = await asyncpg.connect(host='127.0.0.1', port=found.postgres_port, user='postgres')
        try:
            found.postgres_version = str(await connection.fetchval('SHOW server_version'))
        finally:
            await connection.close()
    if found.mongo_uri is not None:
        from pymongo import AsyncMongoClient

        client: Any = AsyncMongoClient(found.mongo_uri)
        try:
            info = await client.server_info()
            found.mongo_version = f'{info.get("version", "?")} (SecantusDB {_version("SecantusDB")})'
        except Exception as error:
            found.mongo_version = f'unknown ({type(error).__name__})'
        finally:
            await client.close()


def machine_lines(arguments: argparse.Namespace, found: Servers, started: float, load_before: Any) -> list[str]:
    control = (
        ["- **Control run** (`--control`): the 'theirs' side is step-persistence again, on fresh stores of its own"]
        if arguments.control
        else []
    )
    return [
        *control,
        f'- Machine: {platform.platform()}, {os.cpu_count()} CPUs ({platform.processor() or platform.machine()}); '
        f'load average before {tuple(round(x, 2) for x in load_before)}, after '
        f'{tuple(round(x, 2) for x in os.getloadavg())}',
        f'- Python {platform.python_version()}; pydantic-ai-slim {_version("pydantic-ai-slim")}; '
        f'step-persistence {_version("step-persistence")}; pydantic-ai-harness {_version("pydantic-ai-harness")}; '
        f'SQLAlchemy {_version("sqlalchemy")}; SQLite {sqlite3.sqlite_version}; asyncpg {_version("asyncpg")}; '
        f'pymongo {_version("pymongo")}',
        f'- PostgreSQL {found.postgres_version} (throwaway cluster as in tests/support/servers: fsync=off, '
        'synchronous_commit=off, on tmpfs); MongoDB wire: ' + found.mongo_version,
        f'- Command: `{" ".join(["python", "benchmarks/bench.py", *sys.argv[1:]])}` (`make bench`), '
        f'{time.time() - started:.0f} s, {time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}',
    ]


def render(
    arguments: argparse.Namespace,
    header: list[str],
    overhead: list[Overhead],
    sizes: dict[tuple[str, str, int], int | str],
    throughput: list[Throughput],
    ops: list[StoreOps],
) -> list[str]:
    out = ['## Measured', '', *header, '']
    if overhead:
        out += [
            '### Agent overhead (FunctionModel agent, K sequential tool calls)',
            '',
            f'Medians of {arguments.rounds} interleaved rounds (3 at K=200; a configuration whose runs add up to more '
            f'than {arguments.budget:.0f} s stops there: `rounds` gives how many it got). Overhead per step = '
            '(run time with - run time without) / K. `ours/theirs` is the ratio of overheads per step (wall ; CPU).',
            '',
            '| backend | K | ms/step without | with/without (ours) | with/without (theirs) | overhead ms/step ours '
            '(wall / CPU) | overhead ms/step theirs (wall / CPU) | ours/theirs (wall ; CPU) | rounds ours / theirs |',
            '|---|---:|---:|---:|---:|---:|---:|---:|---:|',
        ]
        for row in overhead:
            ours_wall, theirs_wall = row.per_step('ours', 'wall'), row.per_step('theirs', 'wall')
            ours_cpu, theirs_cpu = row.per_step('ours', 'cpu'), row.per_step('theirs', 'cpu')
            ratio = None if ours_wall is None or not theirs_wall else ours_wall / theirs_wall
            cpu_ratio = None if ours_cpu is None or not theirs_cpu else ours_cpu / theirs_cpu
            out.append(
                f'| {row.backend} | {row.steps} | {row.none.median_wall * 1e3 / row.steps:.2f} | '
                f'{_fmt(row.ratio("ours"))} | {_fmt(row.ratio("theirs"))} | '
                f'{_fmt(ours_wall)} / {_fmt(ours_cpu)} | '
                f'{_fmt(theirs_wall)} / {_fmt(theirs_cpu)} | {_fmt(ratio, 3)} ; {_fmt(cpu_ratio, 3)} | '
                f'{len(row.runs["ours"].wall)} / {len(row.runs["theirs"].wall)} |'
            )
        errors = [f'- {row.backend} K={row.steps} {lib}: {err}' for row in overhead for lib, err in row.errors.items()]
        if errors:
            out += ['', 'Errors:', '', *errors]
        out += ['', 'Overhead per step at K=200 / at K=10 (wall; CPU):', '']
        out += ['| backend | ours | theirs |', '|---|---:|---:|']
        by_key = {(row.backend, row.steps): row for row in overhead}
        for backend in dict.fromkeys(row.backend for row in overhead):
            low, high = by_key.get((backend, 10)), by_key.get((backend, 200))
            cells = []
            for library in LIBRARIES:
                if low is None or high is None:
                    cells.append('n/a')
                    continue
                parts = []
                for kind in ('wall', 'cpu'):
                    a, b = low.per_step(library, kind), high.per_step(library, kind)
                    parts.append('n/a' if a is None or b is None or a <= 0 else f'{b / a:.2f}')
                cells.append(' ; '.join(parts))
            out.append(f'| {backend} | {cells[0]} | {cells[1]} |')
        out.append('')
    if sizes:
        steps_list = sorted({steps for _, _, steps in sizes})
        out += ['### Storage after one K-step run (fresh store)', '']
        out += [
            'File: bytes of every file under the store directory. SQLite: pages in use after a WAL checkpoint. '
            'PostgreSQL: `pg_total_relation_size` of every user table (indexes and TOAST included) after VACUUM. '
            "MongoDB: BSON bytes of every document (SecantusDB's own files are not comparable with mongod's).",
            '',
            '| backend | library | ' + ' | '.join(f'bytes K={s}' for s in steps_list) + ' | K=200 / K=50 |',
            '|---|---|' + '---:|' * (len(steps_list) + 1),
        ]
        for backend in dict.fromkeys(b for b, _, _ in sizes):
            for library in LIBRARIES:
                cells = [sizes.get((backend, library, s), 'n/a') for s in steps_list]
                a, b = sizes.get((backend, library, 50)), sizes.get((backend, library, 200))
                ratio = f'{b / a:.2f}' if isinstance(a, int) and isinstance(b, int) and a else 'n/a'
                out.append(
                    f'| {backend} | {library} | '
                    + ' | '.join(f'{c:,}' if isinstance(c, int) else str(c) for c in cells)
                    + f' | {ratio} |'
                )
        out.append('')
    if throughput:
        out += ['### Concurrency', '']
        first = throughput[0]
        out += [
            f'{first.agents} agents at once (asyncio.gather in one process), {first.steps} tool calls each, one '
            f'store shared by all; median of {arguments.concurrency_rounds} rounds. Throughput in tool-calling steps '
            'per second (wall).',
            '',
            '| backend | steps/s without | steps/s ours | steps/s theirs | ours / without | theirs / without | '
            'CPU s without / ours / theirs | errors ours / theirs |',
            '|---|---:|---:|---:|---:|---:|---:|---:|',
        ]
        for row in throughput:

            def rate(name: str, row: Throughput = row) -> str:
                bound = '< ' if name in row.timed_out else ''
                return bound + _fmt(row.steps_per_second(name), 0)

            def share(name: str, row: Throughput = row) -> str:
                return ('< ' if name in row.timed_out else '') + _fmt(row.ratio(name))

            out.append(
                f'| {row.backend} | {rate("none")} | {rate("ours")} | {rate("theirs")} | {share("ours")} | '
                f'{share("theirs")} | {row.cpu.get("none", 0):.2f} / {row.cpu.get("ours", 0):.2f} / '
                f'{row.cpu.get("theirs", 0):.2f} | {row.errors.get("ours", 0)} / {row.errors.get("theirs", 0)} |'
            )
        errors = [f'- {row.backend} {name}: {err}' for row in throughput for name, err in row.first_error.items()]
        if errors:
            out += ['', 'First error of each failing configuration:', '', *errors]
        out.append('')
    if ops:
        names = list(dict.fromkeys(name for row in ops for name in row.figures))
        out += [
            '### Store operations',
            '',
            f'One caller, awaited one after another. events/s and effects/s over {arguments.ops} operations; '
            f'snapshots/s over a history growing by 2 messages per save (up to {min(arguments.ops, 500)} saves); '
            f'each rate over the calls made within {arguments.ops_budget:.0f} s if fewer. list_runs among '
            f'{arguments.many_runs:,} runs (10 per conversation and per parent), registered 50 at a time '
            f'(`asyncio.gather`) for at most {arguments.runs_budget:.0f} s; latest_snapshot among '
            f'{arguments.many_snapshots:,} snapshots of one run, saved for at most {arguments.ops_budget:.0f} s '
            '(the `runs` and `snapshots` columns give the counts reached). Query times are medians of 9.',
            '',
            '| backend | library | ' + ' | '.join(names) + ' |',
            '|---|---|' + '---:|' * len(names),
        ]
        for row in ops:
            cells = [row.figures.get(name, 'n/a') for name in names]
            out.append(
                f'| {row.backend} | {row.library} | '
                + ' | '.join(f'{c:,.1f}' if isinstance(c, float) else str(c) for c in cells)
                + ' |'
            )
        out.append('')
    return out


def write_results(path: Path, measured: list[str]) -> None:
    """Replace the `## Measured` section of RESULTS.md (the hand-written analysis above it stays)."""
    marker = '<!-- bench.py writes everything below this line -->'
    existing = path.read_text() if path.exists() else f'# Benchmark results\n\n{marker}\n'
    head = existing.split(marker)[0] if marker in existing else existing.rstrip() + '\n\n'
    path.write_text(head + marker + '\n\n' + '\n'.join(measured).rstrip() + '\n')


@dataclass
class Measurements:
    """Everything one run of the parts measures (one backend's, in a child process, or all merged)."""

    found: Servers = field(default_factory=Servers)
    overhead: list[Overhead] = field(default_factory=list[Overhead])
    sizes: dict[tuple[str, str, int], int | str] = field(default_factory=dict[tuple[str, str, int], int | str])
    throughput: list[Throughput] = field(default_factory=list[Throughput])
    ops: list[StoreOps] = field(default_factory=list[StoreOps])

    def merge(self, other: Measurements) -> None:
        for version in ('postgres_version', 'mongo_version'):
            if getattr(other.found, version) != 'n/a':
                setattr(self.found, version, getattr(other.found, version))
        self.overhead += other.overhead
        self.sizes.update(other.sizes)
        self.throughput += other.throughput
        self.ops += other.ops


async def measure(arguments: argparse.Namespace, backends: list[str], save: Callable[[Measurements], None]) -> None:
    """Run the chosen parts on `backends` in this process, handing what is measured so far to `save`
    after each part (a later failure keeps the earlier parts)."""
    done = Measurements()
    root = Path(tempfile.mkdtemp(prefix='step-persistence-bench-'))
    try:
        with servers(root, postgres='postgres' in backends, mongo='mongo' in backends) as found:
            await server_versions(found)
            done.found = found
            parts = set(arguments.parts)
            if 'overhead' in parts:
                done.overhead = await agent_overhead(
                    backends, arguments.steps, arguments.rounds, arguments.budget, root, found
                )
                save(done)
            if 'storage' in parts:
                durable = [b for b in backends if b in DURABLE]
                done.sizes = await storage(durable, [50, 200], 3 * arguments.budget, root, found)
                save(done)
            if 'concurrency' in parts:
                done.throughput = await concurrency(
                    [b for b in backends if b in ('sqlite', 'postgres')],
                    arguments.agents,
                    arguments.concurrency_steps,
                    arguments.concurrency_rounds,
                    arguments.budget,
                    root,
                    found,
                )
                save(done)
            if 'ops' in parts:
                done.ops = await store_operations(
                    backends,
                    arguments.ops,
                    arguments.many_runs,
                    arguments.many_snapshots,
                    arguments.ops_budget,
                    arguments.runs_budget,
                    root,
                    found,
                )
                save(done)
    finally:
        shutil.rmtree(root, ignore_errors=True)


CHILD_FLAGS = ('control',)
CHILD_OPTIONS = (
    'parts', 'steps', 'rounds', 'agents', 'concurrency_steps', 'concurrency_rounds', 'ops', 'many_runs',
    'many_snapshots', 'budget', 'ops_budget', 'runs_budget',
)  # fmt: skip


def measure_in_child(arguments: argparse.Namespace, backend: str, results: Path) -> Measurements:
    """`measure` on one backend in a fresh Python process, so no backend runs in a process grown by another's."""
    command = [sys.executable, __file__, '--backends', backend, '--child-results', str(results)]
    for option in CHILD_OPTIONS:
        value = getattr(arguments, option)
        command += [f'--{option.replace("_", "-")}', *map(str, value if isinstance(value, list) else [value])]
    command += [f'--{flag}' for flag in CHILD_FLAGS if getattr(arguments, flag)]
    completed = subprocess.run(command, check=False)
    if not results.exists():
        raise SystemExit(f'the {backend} benchmarks measured nothing (exit status {completed.returncode})')
    with results.open('rb') as stream:
        measured: Measurements = pickle.load(stream)
    if completed.returncode != 0:
        print(f'the {backend} benchmarks stopped early (exit {completed.returncode}); keeping what they measured')
    return measured


def main(arguments: argparse.Namespace) -> None:
    global CONTROL
    CONTROL = arguments.control
    if theirs is None and not CONTROL:
        raise SystemExit('pydantic-ai-harness is not installed: run this in the benchmark environment (make bench)')
    if arguments.output is None and not CONTROL:
        arguments.output = str(ROOT / 'benchmarks' / 'RESULTS.md')
    backends = [backend for backend in BACKENDS if backend in arguments.backends]
    if arguments.child_results:
        results = Path(arguments.child_results)

        def keep(done: Measurements) -> None:
            with results.open('wb') as stream:
                pickle.dump(done, stream)

        asyncio.run(measure(arguments, backends, keep))
        return
    started, load_before = time.time(), os.getloadavg()
    everything = Measurements()

    def render_and_write(done: Measurements) -> list[str]:
        """Render what is measured so far, and write it (a later failure keeps the earlier parts)."""
        header = machine_lines(arguments, done.found, started, load_before)
        measured = render(arguments, header, done.overhead, done.sizes, done.throughput, done.ops)
        if arguments.output:
            write_results(Path(arguments.output), measured)
        return measured

    with tempfile.TemporaryDirectory(prefix='step-persistence-bench-results-') as scratch:
        for backend in backends:
            everything.merge(measure_in_child(arguments, backend, Path(scratch) / f'{backend}.pickle'))
            measured = render_and_write(everything)
    print('\n'.join(measured))


if __name__ == '__main__':
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--backends', nargs='+', default=list(BACKENDS), choices=BACKENDS)
    parser.add_argument('--parts', nargs='+', default=['overhead', 'storage', 'concurrency', 'ops'])
    parser.add_argument('--steps', type=int, nargs='+', default=[10, 50, 200])
    parser.add_argument('--rounds', type=int, default=5)
    parser.add_argument('--agents', type=int, default=50)
    parser.add_argument('--concurrency-steps', type=int, default=10)
    parser.add_argument('--concurrency-rounds', type=int, default=3)
    parser.add_argument('--ops', type=int, default=1000)
    parser.add_argument('--many-runs', type=int, default=100_000)
    parser.add_argument('--many-snapshots', type=int, default=10_000)
    parser.add_argument('--budget', type=float, default=30, help='seconds one configuration may use for its rounds')
    parser.add_argument('--ops-budget', type=float, default=30, help='seconds for each rate and the snapshot loop')
    parser.add_argument('--runs-budget', type=float, default=300, help='seconds for registering the many runs')
    parser.add_argument(
        '--output', help='the file whose generated part is rewritten (default: RESULTS.md; none in a control run)'
    )
    parser.add_argument(
        '--control',
        action='store_true',
        help="the 'theirs' side is this library again: ratios near 1 show the comparison is fair",
    )
    parser.add_argument('--child-results', help=argparse.SUPPRESS)
    main(parser.parse_args())
