"""What the file store flushes, and in what order: counted with its own counters and by watching `os`.

A call's `fsync`s are grouped (`stores/file/_io.py`): they wait for the disk together, at a barrier
or at the call's end. What must reach the disk before something else does is flushed at an
earlier barrier: a snapshot's rows and file before the `snapshots.jsonl` line committing it, a
staged directory's files before its rename. The log below records, per call, every write, every
rename and every flush (the files it synced), so these orders are checked, not timed.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import anyio.to_thread
import pytest
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, TextPart, UserPromptPart

from step_persistence import ContinuableSnapshot, FileStepStore, RunRecord, StepEvent, ToolEffectRecord
from step_persistence.records import RunOrigin, StepWrites
from step_persistence.stores._media import MessageMedia
from step_persistence.stores.file import _io
from step_persistence.testing.conformance.conversations import chat_history
from support.chat import chat_agent, chat_turns

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(not Path('/proc/self/fd').is_dir(), reason='names descriptors through /proc'),
]


HINTS = '.latest.'
"""The staged files of a conversation's `latest.<scope>` hint, never flushed (a lost hint costs a repair)."""


def _name(fd: int) -> str:
    return os.readlink(f'/proc/self/fd/{fd}')


class DiskLog:
    """Writes, renames and flushes as they happen, with the paths they touch."""

    def __init__(self) -> None:
        self.entries: list[tuple[str, Any]] = []

    def flushes(self) -> list[set[str]]:
        return [paths for kind, paths in self.entries if kind == 'flush']

    def check_order(self) -> None:
        """Every file written is flushed before a rename puts it (or the directory it is in) in place, and by
        the end of the call."""
        unflushed: set[str] = set()
        for kind, value in self.entries:
            if kind == 'write' and not Path(value).name.startswith(HINTS):
                unflushed.add(value)
            elif kind == 'flush':
                unflushed -= value
            elif kind == 'rename':
                source = value[0]
                moved = sorted(path for path in unflushed if path == source or path.startswith(source + '/'))
                assert not moved, f'{source} renamed before {moved} reached the disk'
        assert not unflushed, f'{sorted(unflushed)} not flushed when the call returned'


@contextmanager
def watched(monkeypatch: pytest.MonkeyPatch) -> Iterator[DiskLog]:
    """Log the file store's writes (`os.write`, `os.pwrite`), renames and flushes while the block runs."""
    log = DiskLog()
    real_write, real_pwrite, real_rename, real_fsync = os.write, os.pwrite, os.rename, os.fsync
    flushing: list[set[str]] = []

    def write(fd: int, data: Any) -> int:
        log.entries.append(('write', _name(fd)))
        return real_write(fd, data)

    def pwrite(fd: int, data: Any, offset: int) -> int:
        log.entries.append(('write', _name(fd)))
        return real_pwrite(fd, data, offset)

    def rename(source: Any, target: Any) -> None:
        log.entries.append(('rename', (os.fspath(source), os.fspath(target))))
        real_rename(source, target)

    def fsync(fd: int) -> None:
        name = _name(fd)
        real_fsync(fd)
        if flushing:
            flushing[-1].add(name)
        else:
            log.entries.append(('flush', {name}))

    real_flush = _io.FileIo._flush

    def flush(self: _io.FileIo, group: Any) -> None:
        flushing.append(set())
        try:
            real_flush(self, group)
        finally:
            synced = flushing.pop()
            if synced:
                log.entries.append(('flush', synced))

    monkeypatch.setattr(os, 'write', write)
    monkeypatch.setattr(os, 'pwrite', pwrite)
    monkeypatch.setattr(os, 'rename', rename)
    monkeypatch.setattr(os, 'fsync', fsync)
    monkeypatch.setattr(_io.FileIo, '_flush', flush)
    try:
        yield log
    finally:
        monkeypatch.undo()


def history(steps: int) -> list[ModelMessage]:
    messages: list[ModelMessage] = [ModelRequest(parts=[UserPromptPart('start')])]
    for step in range(steps):
        messages.append(ModelResponse(parts=[TextPart(f'step {step}')]))
    return messages


def effect(status: str) -> ToolEffectRecord:
    return ToolEffectRecord(run_id='run', tool_call_id='call-1', tool_name='lookup', status=status)  # type: ignore[arg-type]


def event(number: int) -> StepEvent:
    return StepEvent(run_id='run', kind='tool_call_started', step_index=number, idempotency_key=f'event-{number}')


async def test_a_settling_batch_flushes_its_files_together_then_commits_the_snapshot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = FileStepStore(tmp_path)
    await store.register_run(RunRecord(run_id='run'))
    await store.save_snapshot(ContinuableSnapshot(run_id='run', step_index=0, messages=history(1)))
    await store.write_batch(StepWrites(tool_effects=[effect('started')], events=[event(1)]))
    before = store.io_counters.flushes, store.io_counters.files_synced
    with watched(monkeypatch) as log:
        await store.write_batch(
            StepWrites(
                tool_effects=[effect('completed')],
                events=[event(2)],
                snapshots=[ContinuableSnapshot(run_id='run', step_index=1, messages=history(2))],
            )
        )
    log.check_order()
    first, commit = log.flushes()
    run = str(tmp_path / 'run')
    assert {run + '/tool_effects.jsonl', run + '/events.jsonl', run + '/snapshots/2.json', run + '/snapshots'} <= first
    assert any(path.endswith('/messages.jsonl') for path in first), 'the rows with the snapshot file'
    assert commit == {run + '/snapshots.jsonl'}
    assert log.entries.index(('flush', first)) < log.entries.index(('write', run + '/snapshots.jsonl'))
    assert (store.io_counters.flushes - before[0], store.io_counters.files_synced - before[1]) == (2, len(first) + 1)


async def test_a_started_effect_is_on_the_disk_when_its_batch_returns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = FileStepStore(tmp_path)
    await store.register_run(RunRecord(run_id='run'))
    with watched(monkeypatch) as log:
        await store.write_batch(StepWrites(tool_effects=[effect('started')], events=[event(1)]))
    log.check_order()
    run = str(tmp_path / 'run')
    assert log.flushes() == [{run + '/tool_effects.jsonl', run + '/events.jsonl'}], 'one wait for both'


async def test_registrations_and_new_lines_flush_what_they_stage_before_it_appears(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = FileStepStore(tmp_path)
    with watched(monkeypatch) as log:
        await store.register_run(RunRecord(run_id='first', conversation_id='chat', agent_name='writer'))
    log.check_order()
    assert len(log.flushes()) <= 3, log.flushes()  # the conversation's id file, the staged run, its entry
    with watched(monkeypatch) as log:
        await store.save_snapshot(ContinuableSnapshot(run_id='first', step_index=1, messages=chat_history(1)))
    log.check_order()
    origin = RunOrigin(kind='continued', run_id='first', seq=1)
    with watched(monkeypatch) as log:
        await store.register_run(RunRecord(run_id='second', conversation_id='chat', origin=origin))
        await store.save_snapshot(ContinuableSnapshot(run_id='second', step_index=1, messages=chat_history(2)))
    log.check_order()
    with watched(monkeypatch) as log:  # a bare run, registered by its first write, then filled in
        await store.append_event(StepEvent(run_id='bare', kind='tool_call_started', step_index=0))
        await store.register_run(RunRecord(run_id='bare', conversation_id='chat'))
    log.check_order()
    assert [run.run_id for run in await store.list_runs(conversation_id='chat')] == ['first', 'second', 'bare']


async def test_a_chat_turn_flushes_as_much_at_turn_twelve_as_at_turn_three(tmp_path: Path) -> None:
    """Issue 17's turn cost on the file store: each turn's flushes, files synced, files and bytes read."""
    store = FileStepStore(tmp_path)
    agent = chat_agent(store)
    messages: list[ModelMessage] = []
    costs = []
    for _ in range(12):
        counters = store.io_counters
        before = (counters.flushes, counters.files_synced, counters.files_read, counters.bytes_read)
        messages = await chat_turns(agent, 1, messages)
        after = (counters.flushes, counters.files_synced, counters.files_read, counters.bytes_read)
        costs.append(tuple(now - then for now, then in zip(after, before, strict=True)))
    flushes, synced, files, read = zip(*costs[2:], strict=True)
    assert len(set(flushes)) == len(set(synced)) == len(set(files)) == 1, costs
    assert max(read) - min(read) < 64, read  # numbers gain digits; nothing grows with the chat


async def test_a_message_without_payloads_is_packed_in_the_worker_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only a message with something to move to the media store goes back to the event loop for it."""
    store = FileStepStore(tmp_path, fsync=False, media_threshold_bytes=1000)
    await store.register_run(RunRecord(run_id='run'))
    trips: list[object] = []
    real_pack = MessageMedia.pack_message

    async def pack(self: MessageMedia, message: Any) -> Any:
        trips.append(message)
        return await real_pack(self, message)

    monkeypatch.setattr(MessageMedia, 'pack_message', pack)
    await store.save_snapshot(ContinuableSnapshot(run_id='run', step_index=1, messages=history(3)))
    assert trips == []
    large = [*history(3), ModelResponse(parts=[TextPart('x' * 1000)])]
    await store.save_snapshot(ContinuableSnapshot(run_id='run', step_index=2, messages=large))
    assert len(trips) == 1
    latest = await store.latest_snapshot(run_id='run')
    assert latest is not None and latest.messages[-1].parts[0].content == 'x' * 1000  # type: ignore[union-attr]


async def test_a_forked_child_flushes_with_threads_of_its_own(tmp_path: Path) -> None:
    """The flushing threads are the process's: a child forked after the parent made them makes its own
    (the parent's copied pool would take its work and never run it)."""
    store = FileStepStore(tmp_path)
    await store.register_run(RunRecord(run_id='run'))
    await store.write_batch(StepWrites(tool_effects=[effect('started')], events=[event(1)]))  # threads made
    child_writes = partial(store._write_batch, writes=StepWrites(tool_effects=[effect('completed')], events=[event(2)]))
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through its exit status
        code = 1
        try:
            store._runs._write('run', child_writes, register=lambda: None)
            code = 0
        finally:
            os._exit(code)
    try:
        with anyio.fail_after(20):
            _, status = await anyio.to_thread.run_sync(partial(os.waitpid, pid, 0), abandon_on_cancel=True)
    except TimeoutError:
        os.kill(pid, signal.SIGKILL)
        await anyio.to_thread.run_sync(partial(os.waitpid, pid, 0))
        raise
    assert os.waitstatus_to_exitcode(status) == 0
    assert [event.step_index for event in await FileStepStore(tmp_path).list_events(run_id='run')] == [1, 2]


async def test_aclose_lets_the_flushing_threads_end(tmp_path: Path) -> None:
    """A process that forks after closing its stores (as a prefork server or the crash tests' zygote
    does) has no thread of theirs left; the store stays usable and makes new ones."""
    store = FileStepStore(tmp_path)
    await store.register_run(RunRecord(run_id='run'))
    await store.write_batch(StepWrites(tool_effects=[effect('started')], events=[event(1)]))
    pool = store._io._threads._pool
    assert pool is not None
    threads = list(pool._threads)
    assert threads
    await store.aclose()
    for thread in threads:
        await anyio.to_thread.run_sync(partial(thread.join, 20))
        assert not thread.is_alive()
    await store.write_batch(StepWrites(tool_effects=[effect('completed')], events=[event(2)]))
    assert [event.step_index for event in await store.list_events(run_id='run')] == [1, 2]


async def test_a_snapshot_file_left_by_a_crashed_save_is_replaced_not_written_through(tmp_path: Path) -> None:
    """Snapshot files are written without a temporary: one already at the next `seq` (a save that crashed
    before its commit line, or a link planted there) is removed first, and what it points to is kept."""
    store = FileStepStore(tmp_path / 'store')
    await store.register_run(RunRecord(run_id='run'))
    await store.save_snapshot(ContinuableSnapshot(run_id='run', step_index=0, messages=history(1)))
    outside = tmp_path / 'outside.json'
    outside.write_bytes(b"not the store's")
    snapshots = tmp_path / 'store' / 'run' / 'snapshots'
    os.link(outside, snapshots / '2.json')
    (snapshots / '3.json').symlink_to(outside)
    for step in (1, 2):
        await store.save_snapshot(ContinuableSnapshot(run_id='run', step_index=step, messages=history(step + 1)))
    assert outside.read_bytes() == b"not the store's"
    saved = await FileStepStore(tmp_path / 'store').list_snapshots(run_id='run')
    assert [snapshot.step_index for snapshot in saved] == [0, 1, 2]
    assert not (snapshots / '3.json').is_symlink()
