"""FileStepStore on real directories: layout, readable files, run-id validation, durability options."""

from __future__ import annotations

import json
import os
import re
import threading
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from pydantic_ai.messages import ModelMessagesTypeAdapter

from file_store.file_layout import line_of, stored_message_lines
from step_persistence import (
    ContinuableSnapshot,
    FileStepStore,
    RunRecord,
    StepEvent,
    ToolEffectRecord,
    from_spec,
)
from step_persistence.media import DiskMediaStore
from step_persistence.run_ids import validate_path_safe_run_id
from step_persistence.stores.file import store as store_module
from step_persistence.stores.file._layout import MEDIA_DIRECTORY_NAME, RESERVED_NAMES, run_paths
from step_persistence.testing.conformance import sample_history

pytestmark = pytest.mark.anyio

VALID_RUN_ID = re.compile(r'[A-Za-z0-9_.-]{1,200}')


def effect(run_id: str, call_id: str = 't', status: str = 'started') -> ToolEffectRecord:
    return ToolEffectRecord.model_validate(
        {'run_id': run_id, 'tool_call_id': call_id, 'tool_name': 'mail', 'status': status}
    )


def is_invalid_run_id(text: str) -> bool:
    return not VALID_RUN_ID.fullmatch(text) or '..' in text or text == '.'


def snapshot(run_id: str, step: int, **fields: Any) -> ContinuableSnapshot:
    return ContinuableSnapshot(run_id=run_id, step_index=step, messages=sample_history(step, tag=run_id), **fields)


async def test_a_run_is_a_directory_of_readable_json_files(tmp_path: Path) -> None:
    store = FileStepStore(tmp_path)
    record = RunRecord(run_id='run-1', agent_name='librarian', metadata={'tenant': 'acme ✓'})
    await store.register_run(record)
    await store.append_event(StepEvent(run_id='run-1', kind='run_started', step_index=0))
    await store.save_snapshot(snapshot('run-1', 1))
    await store.save_snapshot(snapshot('run-1', 2, state='interrupted', idempotency_key='snap-2'))
    await store.record_tool_effect(effect('run-1', 't1'))

    run_dir = tmp_path / 'run-1'
    assert sorted(path.name for path in run_dir.iterdir()) == [
        'events.jsonl',
        'registration.json',
        'run.json',
        'run.lock',
        'snapshots',
        'snapshots.jsonl',
        'tool_effects.jsonl',
    ]
    run_text = (run_dir / 'run.json').read_text()
    assert run_text.startswith('{\n  "run_id": "run-1",\n'), 'single-object files are indented'
    assert RunRecord.model_validate_json(run_text) == record, 'run.json is the record itself'
    assert json.loads(run_text)['metadata'] == {'tenant': 'acme ✓'}
    assert list(json.loads((run_dir / 'registration.json').read_text())) == ['registered_ns']
    assert 'acme ✓' in run_text, 'non-ASCII text stays readable'
    assert re.search(r'"started_at": "\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+Z"', run_text)

    [event] = [json.loads(line) for line in (run_dir / 'events.jsonl').read_text().splitlines()]
    assert event['kind'] == 'run_started' and event['timestamp'].endswith('Z')
    [ledger_line] = [json.loads(line) for line in (run_dir / 'tool_effects.jsonl').read_text().splitlines()]
    assert (ledger_line['tool_call_id'], ledger_line['status']) == ('t1', 'started')

    assert sorted(path.name for path in (run_dir / 'snapshots').iterdir()) == ['1.json', '2.json']
    second = json.loads((run_dir / 'snapshots' / '2.json').read_text())
    assert (second['seq'], second['step_index'], second['state'], second['idempotency_key']) == (
        2,
        2,
        'interrupted',
        'snap-2',
    )
    [line_dir] = (tmp_path / '@lines').iterdir()
    assert second['history'] == {
        'line': line_dir.name,
        'length': 5,
        'through_message': 5,
        'digest': snapshot('run-1', 2).history_digest(),
    }
    journal = [json.loads(line) for line in (run_dir / 'snapshots.jsonl').read_text().splitlines()]
    assert [(line['seq'], line['state']) for line in journal] == [(1, 'complete'), (2, 'interrupted')]
    assert journal[1]['view'] == second['history'], 'the journal names the view too'

    assert sorted(path.name for path in line_dir.iterdir()) == [
        'children',
        'line.json',
        'line.lock',
        'messages.jsonl',
        'users',
    ]
    assert json.loads((line_dir / 'line.json').read_text()) == {'base': None}
    [user] = (line_dir / 'users').iterdir()
    assert user.name == f'run-1.{(run_dir / "run.lock").read_text()}'
    messages = (line_dir / 'messages.jsonl').read_text().splitlines()
    assert [(json.loads(line)['no'], json.loads(line)['pos']) for line in messages] == [(n, n - 1) for n in range(1, 6)]
    assert sum('start run-1 ✓' in line for line in messages) == 1, 'a message shared by snapshots is stored once'


async def test_snapshots_store_only_new_messages(tmp_path: Path) -> None:
    store = FileStepStore(tmp_path, fsync=False)
    await store.register_run(RunRecord(run_id='grow'))
    history = sample_history(3, tag='grow')
    for length in range(1, len(history) + 1):
        await store.save_snapshot(ContinuableSnapshot(run_id='grow', step_index=length, messages=history[:length]))
    assert stored_message_lines(tmp_path) == len(history)
    snapshots = await store.list_snapshots(run_id='grow')
    assert [len(saved.messages) for saved in snapshots] == list(range(1, len(history) + 1))
    assert ModelMessagesTypeAdapter.dump_json(snapshots[-1].messages) == ModelMessagesTypeAdapter.dump_json(history)


async def test_media_directory_is_reserved_and_no_run_can_shadow_it(tmp_path: Path) -> None:
    store = FileStepStore(tmp_path)
    assert store.media_directory == tmp_path / MEDIA_DIRECTORY_NAME
    for name in RESERVED_NAMES:
        with pytest.raises(ValueError, match='path-safe'):
            await store.register_run(RunRecord(run_id=name))
    for look_alike in ('media', '_media', '.media', 'tmp', '.tmp'):
        await store.register_run(RunRecord(run_id=look_alike))
    assert not store.media_directory.exists()
    assert [run.run_id for run in await store.list_runs()] == ['media', '_media', '.media', 'tmp', '.tmp']


@settings(max_examples=300, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(run_id=st.from_regex(VALID_RUN_ID, fullmatch=True).filter(lambda text: '..' not in text and text != '.'))
@example(run_id='media')
def test_a_run_directory_is_a_child_of_the_store_and_never_a_store_directory(tmp_path: Path, run_id: str) -> None:
    assert validate_path_safe_run_id(run_id) == run_id
    paths = run_paths(tmp_path, run_id)
    assert paths.directory.parent == tmp_path
    assert paths.directory.name == run_id
    assert paths.directory.name not in RESERVED_NAMES


INVALID_RUN_IDS = ['', '.', '..', '../escape', 'a/b', 'a\\b', 'a..b', 'x' * 201, 'nul\x00', 'sp ace', 'é', '@media']


async def _every_method(store: FileStepStore, run_id: str) -> list[BaseException | None]:
    calls = [
        lambda: store.register_run(RunRecord(run_id=run_id)),
        lambda: store.get_run(run_id=run_id),
        lambda: store.append_event(StepEvent(run_id=run_id, kind='run_started', step_index=0)),
        lambda: store.list_events(run_id=run_id),
        lambda: store.save_snapshot(ContinuableSnapshot(run_id=run_id, step_index=0, messages=[])),
        lambda: store.latest_snapshot(run_id=run_id),
        lambda: store.list_snapshots(run_id=run_id),
        lambda: store.record_tool_effect(effect(run_id)),
        lambda: store.get_tool_effect(run_id=run_id, tool_call_id='t'),
        lambda: store.list_unresolved_tool_effects(run_id=run_id),
        lambda: store.delete_run(run_id=run_id),
    ]
    outcomes: list[BaseException | None] = []
    for call in calls:
        try:
            await call()
        except Exception as error:
            outcomes.append(error)
        else:
            outcomes.append(None)
    return outcomes


@pytest.mark.parametrize('run_id', INVALID_RUN_IDS)
async def test_invalid_run_ids_raise_before_touching_the_disk(tmp_path: Path, run_id: str) -> None:
    directory = tmp_path / 'store'
    outcomes = await _every_method(FileStepStore(directory), run_id)
    assert all(isinstance(outcome, ValueError) and 'path-safe' in str(outcome) for outcome in outcomes), outcomes
    assert not directory.exists()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(run_id=st.text(max_size=260).filter(is_invalid_run_id))
def test_any_invalid_run_id_never_touches_the_disk(tmp_path: Path, run_id: str) -> None:
    directory = tmp_path / 'untouched'
    outcomes = anyio.run(_every_method, FileStepStore(directory), run_id)
    assert all(isinstance(outcome, ValueError) for outcome in outcomes), outcomes
    assert not directory.exists()


async def test_duplicate_registration_keeps_the_original_files(tmp_path: Path) -> None:
    store = FileStepStore(tmp_path)
    await store.register_run(RunRecord(run_id='dup', agent_name='first'))
    before = (tmp_path / 'dup' / 'run.json').read_bytes()
    with pytest.raises(ValueError, match='already registered'):
        await FileStepStore(tmp_path).register_run(RunRecord(run_id='dup', agent_name='second'))
    assert (tmp_path / 'dup' / 'run.json').read_bytes() == before
    assert os.listdir(tmp_path / '@tmp') == [], 'the losing registration leaves nothing behind'


async def test_get_run_raises_for_a_corrupt_run_file_and_list_runs_skips_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = FileStepStore(tmp_path)
    await store.register_run(RunRecord(run_id='good'))
    await store.register_run(RunRecord(run_id='bad'))
    for corrupt in (
        {'run_id': 'bad', 'started_at': 'yesterday'},
        {'run': {'run_id': 'bad', 'started_at': 'yesterday'}, 'registered_ns': 1},  # as written before issue 19
    ):
        caplog.clear()
        (tmp_path / 'bad' / 'run.json').write_text(json.dumps(corrupt))
        with pytest.raises(ValueError, match='started_at'):
            await store.get_run(run_id='bad')
        assert [run.run_id for run in await store.list_runs()] == ['good']
        assert 'bad/run.json' in caplog.text


async def test_deleting_a_run_removes_its_directory_only(tmp_path: Path) -> None:
    store = FileStepStore(tmp_path)
    store.media_directory.mkdir()
    (store.media_directory / 'blob.bin').write_bytes(b'shared')
    for run_id in ('gone', 'kept'):
        await store.register_run(RunRecord(run_id=run_id))
        await store.save_snapshot(snapshot(run_id, 1))
    kept_line = line_of(tmp_path, 'kept')
    await store.delete_run(run_id='gone')
    assert sorted(os.listdir(tmp_path)) == ['@indexed', '@lines', '@media', '@runs', '@tmp', 'kept']
    assert os.listdir(tmp_path / '@lines') == [kept_line.name], 'the line only the deleted run used is gone'
    assert os.listdir(tmp_path / '@tmp') == []
    assert (store.media_directory / 'blob.bin').read_bytes() == b'shared'


async def test_another_store_sees_keys_and_a_run_registered_again(tmp_path: Path) -> None:
    first, second = FileStepStore(tmp_path), FileStepStore(tmp_path)
    await first.register_run(RunRecord(run_id='shared'))
    await first.append_event(StepEvent(run_id='shared', kind='run_started', step_index=0, idempotency_key='k'))
    await second.append_event(StepEvent(run_id='shared', kind='run_failed', step_index=0, idempotency_key='k'))
    await first.save_snapshot(snapshot('shared', 1, idempotency_key='s'))
    await second.save_snapshot(snapshot('shared', 2, idempotency_key='s'))
    await second.save_snapshot(snapshot('shared', 3))
    assert [event.kind for event in await second.list_events(run_id='shared')] == ['run_started']
    assert [(s.seq, s.step_index) for s in await first.list_snapshots(run_id='shared')] == [(1, 1), (2, 3)]

    # The second store deletes and registers the run again; the first must not reuse what it knew.
    await second.delete_run(run_id='shared')
    await second.register_run(RunRecord(run_id='shared', agent_name='again'))
    await first.append_event(StepEvent(run_id='shared', kind='run_started', step_index=0, idempotency_key='k'))
    await first.save_snapshot(snapshot('shared', 7, idempotency_key='s'))
    assert len(await second.list_events(run_id='shared')) == 1
    assert [(s.seq, s.step_index) for s in await second.list_snapshots(run_id='shared')] == [(1, 7)]


async def test_evicted_indexes_are_rebuilt_from_the_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(store_module, 'INDEX_CACHE_CAPACITY', 2)
    store = FileStepStore(tmp_path, fsync=False)
    run_ids = [f'run-{number}' for number in range(5)]
    for run_id in run_ids:
        await store.register_run(RunRecord(run_id=run_id))
        await store.append_event(StepEvent(run_id=run_id, kind='run_started', step_index=0, idempotency_key='k'))
        await store.save_snapshot(snapshot(run_id, 1, idempotency_key='s'))
    for run_id in run_ids:
        await store.append_event(StepEvent(run_id=run_id, kind='run_failed', step_index=1, idempotency_key='k'))
        await store.save_snapshot(snapshot(run_id, 2, idempotency_key='s'))
        await store.save_snapshot(snapshot(run_id, 3))
        assert len(await store.list_events(run_id=run_id)) == 1
        assert [s.seq for s in await store.list_snapshots(run_id=run_id)] == [1, 2]


async def test_blocking_work_runs_in_worker_threads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    loop_thread = threading.current_thread()
    io_threads: list[threading.Thread] = []
    for name in ('open', 'pread', 'write', 'rename', 'replace'):
        original = getattr(os, name)

        def recording(*args: Any, _original: Any = original, **kwargs: Any) -> Any:
            io_threads.append(threading.current_thread())
            return _original(*args, **kwargs)

        monkeypatch.setattr(os, name, recording)
    encoding_threads: list[threading.Thread] = []
    original_encode = ContinuableSnapshot.encoded_messages

    def recording_encode(self: ContinuableSnapshot) -> Any:
        encoding_threads.append(threading.current_thread())
        return original_encode(self)

    monkeypatch.setattr(ContinuableSnapshot, 'encoded_messages', recording_encode)

    store = FileStepStore(tmp_path)
    await store.register_run(RunRecord(run_id='threads'))
    await store.save_snapshot(snapshot('threads', 4))
    await store.append_event(StepEvent(run_id='threads', kind='run_started', step_index=0))
    assert await store.latest_snapshot(run_id='threads') is not None
    await store.list_runs()
    await store.delete_run(run_id='threads')
    assert len(io_threads) > 20 and len(encoding_threads) == 1
    assert loop_thread not in io_threads + encoding_threads


async def test_fsync_makes_files_and_directory_entries_durable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[tuple[int, int]] = []
    original_fsync = os.fsync

    def recording_fsync(fd: int) -> None:
        status = os.fstat(fd)
        synced.append((status.st_dev, status.st_ino))
        original_fsync(fd)

    monkeypatch.setattr(os, 'fsync', recording_fsync)

    def identity(path: Path) -> tuple[int, int]:
        status = path.stat()
        return status.st_dev, status.st_ino

    async def exercise(store: FileStepStore, run_id: str) -> None:
        await store.register_run(RunRecord(run_id=run_id))
        await store.append_event(StepEvent(run_id=run_id, kind='run_started', step_index=0))
        await store.save_snapshot(snapshot(run_id, 1))
        await store.record_tool_effect(effect(run_id))

    await exercise(FileStepStore(tmp_path / 'fast', fsync=False), 'run')
    assert synced == []

    root = tmp_path / 'durable'
    await exercise(FileStepStore(root), 'run')
    run_dir = root / 'run'
    line_dir = line_of(root, 'run')
    expected = {
        'the store directory (run entry)': root,
        'the run directory': run_dir,
        'run.json': run_dir / 'run.json',
        'registration.json': run_dir / 'registration.json',
        'run.lock': run_dir / 'run.lock',
        'events.jsonl': run_dir / 'events.jsonl',
        'snapshots.jsonl': run_dir / 'snapshots.jsonl',
        'tool_effects.jsonl': run_dir / 'tool_effects.jsonl',
        'the snapshot file': run_dir / 'snapshots' / '1.json',
        'the snapshots directory (snapshot entry)': run_dir / 'snapshots',
        'the lines directory (line entry)': root / '@lines',
        'the line directory': line_dir,
        'line.json': line_dir / 'line.json',
        'line.lock': line_dir / 'line.lock',
        'the line messages.jsonl': line_dir / 'messages.jsonl',
        'the users directory (user entry)': line_dir / 'users',
    }
    missing = [what for what, path in expected.items() if identity(path) not in synced]
    assert missing == []


@pytest.mark.parametrize('bad', [0, -1, 1.5, '64', True])
def test_media_threshold_must_be_a_positive_int(tmp_path: Path, bad: object) -> None:
    with pytest.raises(ValueError, match='threshold_bytes'):
        FileStepStore(tmp_path, media_threshold_bytes=bad)  # type: ignore[arg-type]


def test_media_store_must_be_a_media_store_auto_or_none(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match='media_store'):
        FileStepStore(tmp_path, media_store='disk')  # type: ignore[arg-type]


@pytest.mark.parametrize('bad', ['false', 0, None])
def test_fsync_must_be_a_bool(tmp_path: Path, bad: object) -> None:
    with pytest.raises(ValueError, match='fsync'):
        FileStepStore(tmp_path, fsync=bad)  # type: ignore[arg-type]


def test_media_options_resolve_to_a_media_store(tmp_path: Path) -> None:
    store = FileStepStore(tmp_path, media_store=None, media_threshold_bytes=10)
    assert (store.media_store, store.media_threshold_bytes) == (None, 10)
    default = FileStepStore(tmp_path)
    assert isinstance(default.media_store, DiskMediaStore)
    assert (default.media_store.directory, default.media_threshold_bytes) == (default.media_directory, 65536)
    disk = DiskMediaStore(tmp_path / 'blobs')
    assert FileStepStore(tmp_path, media_store=disk).media_store is disk


async def test_from_spec_builds_file_stores(tmp_path: Path) -> None:
    by_name = from_spec('file', directory=str(tmp_path / 'a'), max_snapshots_per_run=3)
    by_keyword = from_spec(backend='file', directory=str(tmp_path / 'a'))
    by_url = from_spec(f'file://{tmp_path / "a"}', fsync=False)
    assert isinstance(by_name, FileStepStore) and by_name.max_snapshots_per_run == 3
    assert isinstance(by_url, FileStepStore) and by_url.fsync is False
    await by_name.register_run(RunRecord(run_id='one'))
    assert await by_keyword.get_run(run_id='one') is not None
    assert await by_url.get_run(run_id='one') is not None
    with pytest.raises(ValueError, match='not both'):
        from_spec(f'file://{tmp_path}', directory=str(tmp_path))
    with pytest.raises(ValueError, match='names no directory'):
        from_spec('file://')


async def test_a_closed_store_stays_usable(tmp_path: Path) -> None:
    async with FileStepStore(tmp_path) as store:
        await store.register_run(RunRecord(run_id='r'))
    await store.append_event(StepEvent(run_id='r', kind='run_started', step_index=0))
    assert len(await store.list_events(run_id='r')) == 1
