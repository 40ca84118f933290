"""The reliability tests' zygote: imports pydantic-ai and every store once, then forks children.

Usage: python crash_zygote.py. Prints `ready` once imported and warmed up. Then, for each JSON line
read on stdin, either
- a run command (see `run_agent`): it forks a child that runs one scripted agent, waits for the
  child to end (normally or killed), and prints `{"op": "exit", "status": <exit code>}`; or
- `{"writers": [job, ...]}` (see `WRITERS`): it forks one child per job, releases them all at the
  same moment, waits for all, and prints `{"op": "exit", "statuses": [<exit code>, ...]}`.

The child talks to the test directly over the zygote's stdin and stdout (the zygote reads nothing
while a child lives). Protocol, one JSON object per line, numbered from 1 after `hello`: the child
writes each progress message as it happens; at message number `kill_at` (from the run command) it
stops until it reads the line `go`, so when the test kills it there, nothing after that message
has happened. Messages, in the order they happen:

- `{"op": "hello", "pid": P}`: the child started.
- `{"op": "begin", "n": N, "items": [...]}`: store write N is about to start; `items` are the records
  it writes, in the order the store applies them: `["run", run_id]`, `["effect", tool_call_id,
  status, tool_name, idempotency_key, effect_summary]`, `["event", idempotency_key, kind,
  tool_call_id]`, `["snapshot", idempotency_key, state, digest]` (digest: sha256 of the messages'
  JSON).
- `{"op": "io", "what": ...}`: the store is inside write N, about to do one more I/O step (an SQL
  statement or commit, a MongoDB command, a file write, half of a file write, an fsync, a rename).
- `{"op": "done", "n": N}`: store write N returned: everything in it is committed.
- `{"op": "tool", "call": tool_call_id}`: a tool body started (its side effect happens now).
- `{"op": "finished"}`: the run ended (no `go` awaited); the child exits 0.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pydantic_ai import Agent, ModelRetry, RunContext
from pydantic_ai.messages import ModelMessage, ModelMessagesTypeAdapter
from pymongo import AsyncMongoClient, monitoring
from sqlalchemy import event
from sqlalchemy.engine import Engine

from step_persistence import StepPersistence, StepStore, annotate_tool_effect, from_spec
from step_persistence._history import decode_messages
from step_persistence.protocol import write_steps
from step_persistence.records import ContinuableSnapshot, RunRecord, StepEvent, StepWrites, ToolEffectRecord
from step_persistence.stores.file._io import FileIo
from step_persistence.stores.mongo import MongoStepStore
from step_persistence.stores.sql import SqliteStepStore  # noqa: F401  (imported once, before forking)
from step_persistence.testing.conformance import sample_history
from support.scripted import calls, scripted, text
from support.writer import write as write_runs

CONVERSATION = 'crash'
"""The conversation every crash run belongs to."""


def digest(messages: list[ModelMessage]) -> str:
    """A fingerprint of a history, equal for equal histories (the test computes it on what it reads back)."""
    return hashlib.sha256(ModelMessagesTypeAdapter.dump_json(messages)).hexdigest()


def read_line(fd: int) -> str:
    """One line from `fd`, read byte by byte so that nothing meant for another process is consumed."""
    data = bytearray()
    while True:
        byte = os.read(fd, 1)
        if not byte:
            return data.decode() if data else ''
        if byte == b'\n':
            return data.decode()
        data += byte


def write_line(fd: int, message: dict[str, Any]) -> None:
    """One whole line in one `write` (atomic on a pipe)."""
    os.write(fd, (json.dumps(message) + '\n').encode())


class Progress:
    """The child's side of the protocol: report (from any thread, one at a time), stop at `kill_at`."""

    def __init__(self, inbound: int, outbound: int, kill_at: int | None) -> None:
        self._inbound, self._outbound = inbound, outbound
        self._kill_at = kill_at
        self._lock = threading.Lock()
        self._sent = 0
        self._writes = 0
        self.in_write = 0
        """How many store writes are in progress (I/O is reported only inside one)."""

    def report(self, op: str, **fields: Any) -> None:
        with self._lock:
            write_line(self._outbound, {'op': op, **fields})
            if op == 'hello':
                return
            self._sent += 1
            if self._sent == self._kill_at and read_line(self._inbound) != 'go':
                os._exit(3)

    def io(self, what: str) -> None:
        if self.in_write:
            self.report('io', what=what)

    def next_write(self) -> int:
        self._writes += 1
        return self._writes


def effect_item(record: ToolEffectRecord) -> list[Any]:
    return [
        'effect',
        record.tool_call_id,
        record.status,
        record.tool_name,
        record.idempotency_key,
        record.effect_summary,
    ]


def event_item(record: StepEvent) -> list[Any]:
    return ['event', record.idempotency_key, record.kind, record.tool_call_id]


def snapshot_item(record: ContinuableSnapshot) -> list[Any]:
    """The digest is of the history as the store is given it: encoded when the snapshot was taken.

    (pydantic-ai fills in the newest request's timestamp and run id only when it sends it, later.)
    """
    stored = decode_messages([message.tree() for message in record.encoded_messages()])
    return ['snapshot', record.idempotency_key, record.state, digest(stored)]


class ReportingStore:
    """A store that reports each write before it starts and after it returns, then forwards it."""

    def __init__(self, inner: StepStore, progress: Progress) -> None:
        self._inner = inner
        self._progress = progress

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def _write(self, items: list[list[Any]], write: Any) -> None:
        number = self._progress.next_write()
        self._progress.report('begin', n=number, items=items)
        self._progress.in_write += 1
        try:
            await write
        finally:
            self._progress.in_write -= 1
        self._progress.report('done', n=number)

    async def register_run(self, record: RunRecord) -> None:
        await self._write([['run', record.run_id]], self._inner.register_run(record))

    async def write_batch(self, writes: StepWrites) -> None:
        items = [
            *map(effect_item, writes.tool_effects),
            *map(event_item, writes.events),
            *map(snapshot_item, writes.snapshots),
        ]
        await self._write(items, write_steps(self._inner, writes))

    async def record_tool_effect(self, record: ToolEffectRecord) -> None:
        await self._write([effect_item(record)], self._inner.record_tool_effect(record))

    async def append_event(self, event: StepEvent) -> None:
        await self._write([event_item(event)], self._inner.append_event(event))

    async def save_snapshot(self, snapshot: ContinuableSnapshot) -> None:
        await self._write([snapshot_item(snapshot)], self._inner.save_snapshot(snapshot))


def hook_sql(progress: Progress) -> None:
    """Report every SQL statement and commit of every engine in this process."""

    def before_execute(connection: Any, cursor: Any, statement: str, *args: Any) -> None:
        progress.io(' '.join(statement.split()[:3]))

    def before_commit(connection: Any) -> None:
        progress.io('COMMIT')

    event.listen(Engine, 'before_cursor_execute', before_execute)
    event.listen(Engine, 'commit', before_commit)


def hook_files(progress: Progress) -> None:
    """Report every file write step; a data write is split in two halves with a report between them."""
    original_write_all = FileIo._write_all
    wrapped = {name: getattr(FileIo, name) for name in ('append', 'create', 'write_atomic', 'sync_directory')}

    def write_all(self: FileIo, fd: int, data: bytes) -> None:
        half = len(data) // 2
        if half:
            original_write_all(self, fd, data[:half])
            progress.io(f'half of {len(data)} bytes written')
        original_write_all(self, fd, data[half:])

    def reporting(name: str, method: Any) -> Any:
        def call(self: FileIo, path: Path, *args: Any) -> None:
            progress.io(f'{name} {path.name}')
            method(self, path, *args)

        return call

    FileIo._write_all = write_all  # type: ignore[method-assign]
    for name, method in wrapped.items():
        setattr(FileIo, name, reporting(name, method))


class MongoCommands(monitoring.CommandListener):
    """Reports every MongoDB command before it is sent."""

    def __init__(self, progress: Progress) -> None:
        self._progress = progress

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        self._progress.io(f'mongo {event.command_name}')

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        pass

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        pass


def open_store(spec: dict[str, Any], progress: Progress) -> StepStore:
    backend = spec['backend']
    if backend == 'mongo':
        client: AsyncMongoClient[Any] = AsyncMongoClient(spec['db_url'], event_listeners=[MongoCommands(progress)])
        return MongoStepStore(client=client, database=spec['database'])
    if backend == 'file':
        hook_files(progress)
    else:
        hook_sql(progress)
    return from_spec(**spec)


def crash_agent(store: StepStore, progress: Progress, *, run_id: str, capture_frontier: bool) -> Agent[None, str]:
    """Two parallel tool calls, then one that asks for a retry (so its call fails), then the answer."""
    agent = Agent(
        scripted(
            calls(('prepare', {'n': 1}, 'prepare-1'), ('charge', {'cents': 500}, 'charge-1')),
            calls(('ship', {'to': 'Hanoi'}, 'ship-1')),
            text('done'),
        ),
        capabilities=[StepPersistence(store=store, run_id=run_id, capture_frontier=capture_frontier)],
    )

    @agent.tool
    async def prepare(ctx: RunContext[None], n: int) -> str:
        progress.report('tool', call=ctx.tool_call_id)
        return f'prepared {n}'

    @agent.tool
    async def charge(ctx: RunContext[None], cents: int) -> str:
        progress.report('tool', call=ctx.tool_call_id)
        await annotate_tool_effect(store, ctx, idempotency_key=f'{run_id}-charge', effect_summary=f'charge {cents}')
        return f'charged {cents}'

    @agent.tool
    async def ship(ctx: RunContext[None], to: str) -> str:
        progress.report('tool', call=ctx.tool_call_id)
        raise ModelRetry(f'no courier to {to} today')

    return agent


async def run_agent(command: dict[str, Any], progress: Progress) -> None:
    """`command`: `{"spec": from_spec options, "run_id": ..., "capture_frontier": bool, "kill_at": int | None}`."""
    store = open_store(command['spec'], progress)
    reporting: Any = ReportingStore(store, progress)
    agent = crash_agent(reporting, progress, run_id=command['run_id'], capture_frontier=command['capture_frontier'])
    result = await agent.run('ship order 7', conversation_id=CONVERSATION)
    assert result.output == 'done', result.output
    await store.aclose()
    client = getattr(store, 'client', None)
    if isinstance(client, AsyncMongoClient):
        await client.close()


def child(command: dict[str, Any]) -> int:
    inbound, outbound = os.dup(0), os.dup(1)
    os.dup2(2, 1)  # anything printed goes to the log, never into the protocol
    progress = Progress(inbound, outbound, command['kill_at'])
    try:
        progress.report('hello', pid=os.getpid())
        asyncio.run(run_agent(command, progress))
    except BaseException:
        traceback.print_exc()
        return 1
    progress.report('finished')
    return 0


class Silent(Progress):
    """No protocol: for the zygote's own warm-up runs."""

    def __init__(self) -> None:
        super().__init__(-1, -1, None)

    def report(self, op: str, **fields: Any) -> None:
        pass


def warm_up() -> None:
    """Run the agent once per local backend, so that no child pays for first-use work (schemas, migrations).

    Forking is safe only with one thread: wait until the store's worker threads have exited.
    """
    with tempfile.TemporaryDirectory() as directory:
        for spec in (
            {'backend': 'memory'},
            {'backend': 'file', 'directory': f'{directory}/files'},
            {'backend': 'sqlite', 'database': f'{directory}/warm.db'},
        ):
            store = from_spec(**spec)
            agent = crash_agent(store, Silent(), run_id='warm-up', capture_frontier=True)

            async def run(agent: Agent[None, str] = agent, store: StepStore = store) -> None:
                await agent.run('warm up')
                await store.aclose()

            asyncio.run(run())
    deadline = time.monotonic() + 30
    while threading.active_count() > 1:
        if time.monotonic() > deadline:
            raise RuntimeError(f'threads left after the warm-up: {threading.enumerate()}')
        time.sleep(0.01)


async def save_snapshots(spec: dict[str, Any], run_id: str, writer: int, count: int) -> None:
    """Save `count` snapshots of `run_id`: step index `writer * 1000 + i`, key `writer-i`, every third interrupted."""
    async with from_spec(**spec) as store:
        for number in range(count):
            await store.save_snapshot(keyed_snapshot(run_id, writer, number))


def keyed_snapshot(run_id: str, writer: int, number: int) -> ContinuableSnapshot:
    step = writer * 1000 + number
    return ContinuableSnapshot(
        run_id=run_id,
        step_index=step,
        messages=sample_history(1, tag=f'{writer}-{number}'),
        state='interrupted' if number % 3 == 0 else 'complete',
        idempotency_key=f'{writer}-{number}',
    )


WRITERS: dict[str, Any] = {'runs': write_runs, 'snapshots': save_snapshots}
"""Writer jobs: `{"kind": "runs", "args": {"spec", "prefix", "count"}}` (`tests/support/writer.py`: COUNT runs
named PREFIX-<n>, each with three events, two snapshots and a tool effect), or `{"kind": "snapshots",
"args": {"spec", "run_id", "writer", "count"}}` (`save_snapshots`)."""


def run_writers(jobs: list[dict[str, Any]]) -> list[int]:
    release_read, release_write = os.pipe()
    pids: list[int] = []
    for job in jobs:
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                os.close(release_write)
                os.dup2(2, 1)
                os.read(release_read, 1)  # returns when the zygote closes the pipe: every writer starts now
                asyncio.run(WRITERS[job['kind']](**job['args']))
                code = 0
            except BaseException:
                traceback.print_exc()
            finally:
                sys.stderr.flush()
                os._exit(code)
        pids.append(pid)
    os.close(release_read)
    os.close(release_write)
    return [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in pids]


def main() -> None:
    warm_up()
    write_line(1, {'op': 'ready'})
    while line := read_line(0):
        command = json.loads(line)
        if 'writers' in command:
            write_line(1, {'op': 'exit', 'statuses': run_writers(command['writers'])})
            continue
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                code = child(command)
            finally:
                sys.stderr.flush()
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        write_line(1, {'op': 'exit', 'status': os.waitstatus_to_exitcode(status)})


if __name__ == '__main__':
    main()
