"""FileStepStore over hostile and damaged files (issue 16): nothing altered is returned as true,
one damaged line or record never hides the healthy ones, and nothing is written outside the store."""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
from pathlib import Path

import pytest
from pydantic_ai.messages import ModelMessagesTypeAdapter

from file_store.file_layout import line_of, message_lines, messages_of
from step_persistence import ContinuableSnapshot, FileStepStore, RunRecord, StepEvent, ToolEffectRecord
from step_persistence.testing.conformance import sample_history

pytestmark = pytest.mark.anyio


@pytest.fixture
def caplog(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.WARNING, logger='step_persistence')
    return caplog


def snapshot(step: int, run_id: str = 'run') -> ContinuableSnapshot:
    return ContinuableSnapshot(run_id=run_id, step_index=step, messages=sample_history(step, tag=run_id))


def dump(snapshot: ContinuableSnapshot) -> bytes:
    return ModelMessagesTypeAdapter.dump_json(snapshot.messages)


def event(step: int, run_id: str = 'run') -> StepEvent:
    return StepEvent(run_id=run_id, kind='model_request_started', step_index=step)


def effect(call_id: str, run_id: str = 'run') -> ToolEffectRecord:
    return ToolEffectRecord(run_id=run_id, tool_call_id=call_id, tool_name='mail', status='started')


@pytest.fixture
async def store(tmp_path: Path) -> FileStepStore:
    store = FileStepStore(tmp_path, fsync=False)
    await store.register_run(RunRecord(run_id='run'))
    return store


def rewrite_message_line(tmp_path: Path, number: int, old: bytes, new: bytes, run_id: str = 'run') -> None:
    """Replace `old` by `new` in the line of message `number` of the run's line (exactly once)."""
    path = messages_of(tmp_path, run_id)
    lines = path.read_bytes().splitlines()
    assert lines[number - 1].count(old) == 1
    lines[number - 1] = lines[number - 1].replace(old, new)
    path.write_bytes(b''.join(line + b'\n' for line in lines))


# --- item 4: a message altered on disk is never returned as true ---


@pytest.mark.parametrize(
    ('number', 'old', 'new'),
    [
        pytest.param(4, b'"thinking 1"', b'"thinking 9"', id='inline-text-same-length'),
        pytest.param(4, b'"args":{"n":1}', b'"args":{"n":7}', id='inline-tool-arguments'),
        pytest.param(5, b'"x"]', b'"y"]', id='externalized-message-text'),
        pytest.param(5, b'"identifier":"42bb35"', b'"identifier":"42bb36"', id='externalized-beside-a-marker'),
    ],
)
async def test_a_message_altered_on_disk_makes_its_snapshots_unreadable(
    store: FileStepStore, tmp_path: Path, caplog: pytest.LogCaptureFixture, number: int, old: bytes, new: bytes
) -> None:
    """Messages 4 and 5 belong to snapshot 2 only: it is skipped and logged, snapshot 1 is returned."""
    await store.save_snapshot(snapshot(1))
    await store.save_snapshot(snapshot(2))
    rewrite_message_line(tmp_path, number, old, new)
    for reader in (FileStepStore(tmp_path), store):
        caplog.clear()
        latest = await reader.latest_snapshot(run_id='run')
        assert latest is not None and latest.seq == 1 and dump(latest) == dump(snapshot(1))
        assert 'skipping unreadable snapshot' in caplog.text and 'digest' in caplog.text
        assert [item.seq for item in await reader.list_snapshots(run_id='run')] == [1]


@pytest.mark.parametrize('writer', ['fresh-store', 'store-that-read-it'])
async def test_a_save_after_a_message_was_altered_writes_it_again(
    store: FileStepStore, tmp_path: Path, writer: str
) -> None:
    """The damaged line is never reused: the next save of the same history stores that message anew."""
    await store.save_snapshot(snapshot(1))
    await store.save_snapshot(snapshot(2))
    rewrite_message_line(tmp_path, 5, b'"x"]', b'"y"]')
    if writer == 'fresh-store':
        store = FileStepStore(tmp_path, fsync=False)
    else:
        await store.list_snapshots(run_id='run')
    await store.save_snapshot(snapshot(2))
    assert len(message_lines(tmp_path, 'run')) == 6
    latest = await FileStepStore(tmp_path).latest_snapshot(run_id='run')
    assert latest is not None and latest.seq == 3 and dump(latest) == dump(snapshot(2))


async def test_a_message_every_snapshot_uses_altered_leaves_no_snapshot(store: FileStepStore, tmp_path: Path) -> None:
    await store.save_snapshot(snapshot(1))
    await store.save_snapshot(snapshot(2))
    rewrite_message_line(tmp_path, 1, b'start run', b'start rum')
    reader = FileStepStore(tmp_path)
    assert await reader.latest_snapshot(run_id='run', include_interrupted=True) is None
    assert await reader.list_snapshots(run_id='run') == []


async def test_untouched_messages_still_read_back_and_new_saves_work(store: FileStepStore, tmp_path: Path) -> None:
    """The check accepts every line the store wrote, inline and externalized, after compaction too."""
    for step in (1, 2, 3):
        await store.save_snapshot(snapshot(step))
    externalized = [json.loads(line)['externalized'] for line in message_lines(tmp_path, 'run')]
    assert True in externalized and False in externalized
    reader = FileStepStore(tmp_path)
    assert [dump(item) for item in await reader.list_snapshots(run_id='run')] == [
        dump(snapshot(step)) for step in (1, 2, 3)
    ]


async def test_a_snapshot_file_whose_state_disagrees_with_its_commit_is_skipped(
    store: FileStepStore, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """`latest_snapshot` returns only complete snapshots: a file edited to say otherwise is not one of them."""
    for step in (1, 2, 3):
        await store.save_snapshot(snapshot(step))
    path = tmp_path / 'run' / 'snapshots' / '3.json'
    path.write_text(path.read_text().replace('"complete"', '"interrupted"'))
    reader = FileStepStore(tmp_path)
    latest = await reader.latest_snapshot(run_id='run')
    assert latest is not None and (latest.seq, latest.state) == (2, 'complete')
    assert "says 'interrupted'" in caplog.text
    assert [item.seq for item in await reader.list_snapshots(run_id='run', include_interrupted=True)] == [1, 2]


# --- item 6: a stored position is bounded by what the run can hold ---


def planted_message_line(no: int, pos: int) -> bytes:
    body = b'{"parts":[],"kind":"request"}'
    return b'{"no":%d,"pos":%d,"digest":"%s","externalized":false,"message":%s}\n' % (
        no,
        pos,
        hashlib.sha256(body).hexdigest().encode(),
        body,
    )


@pytest.mark.parametrize(
    ('no', 'pos'),
    [
        pytest.param(6, 30_000_000, id='position-beyond-its-number'),
        pytest.param(30_000_001, 30_000_000, id='number-and-position-both-huge'),
        pytest.param(2, 1, id='number-below-an-earlier-line'),
    ],
)
async def test_a_message_line_claiming_an_impossible_position_is_skipped(
    store: FileStepStore, tmp_path: Path, caplog: pytest.LogCaptureFixture, no: int, pos: int
) -> None:
    """Trusting the line would make every read allocate a list as long as the claimed position."""
    await store.save_snapshot(snapshot(1))
    await store.save_snapshot(snapshot(2))
    with messages_of(tmp_path, 'run').open('ab') as file:
        file.write(planted_message_line(no, pos))
    for reader in (FileStepStore(tmp_path), store):
        caplog.clear()
        assert [dump(item) for item in await reader.list_snapshots(run_id='run')] == [
            dump(snapshot(1)),
            dump(snapshot(2)),
        ]
        assert 'skipping unreadable line' in caplog.text and 'messages.jsonl' in caplog.text
        assert f'position {pos}' in caplog.text or f'number {no}' in caplog.text
    await store.save_snapshot(snapshot(3))
    latest = await FileStepStore(tmp_path).latest_snapshot(run_id='run')
    assert latest is not None and dump(latest) == dump(snapshot(3))


# --- item 9: directory names and symbolic links are not trusted ---


def tree_of(path: Path) -> dict[str, bytes | None]:
    """Every file and directory under `path`, with the bytes of each file."""
    return {
        os.fspath(item.relative_to(path)): None if item.is_dir() else item.read_bytes()
        for item in sorted(path.rglob('*'))
    }


async def test_a_run_directory_copied_under_another_name_is_not_a_second_run(
    store: FileStepStore, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    await store.append_event(event(0))
    await store.save_snapshot(snapshot(1))
    shutil.copytree(tmp_path / 'run', tmp_path / 'copy')
    before = tree_of(tmp_path / 'copy')
    for reader in (FileStepStore(tmp_path), store):
        caplog.clear()
        assert [record.run_id for record in await reader.list_runs()] == ['run']  # the copy has no index entry
        with pytest.raises(ValueError, match="holds run 'run'"):
            await reader.get_run(run_id='copy')
        for call in (
            reader.list_events(run_id='copy'),
            reader.latest_snapshot(run_id='copy'),
            reader.list_tool_effects(run_id='copy'),
            reader.append_event(event(1, run_id='copy')),
            reader.save_snapshot(snapshot(2, run_id='copy')),
            reader.record_tool_effect(effect('t', run_id='copy')),
            reader.delete_run(run_id='copy'),
        ):
            with pytest.raises(ValueError, match="holds run 'run'"):
                await call
    assert tree_of(tmp_path / 'copy') == before
    assert len(await store.list_events(run_id='run')) == 1


async def test_lines_of_another_run_are_not_returned_as_this_runs(
    store: FileStepStore, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    await store.register_run(RunRecord(run_id='other'))
    await store.append_event(event(0, run_id='other'))
    await store.record_tool_effect(effect('t-other', run_id='other'))
    await store.save_snapshot(snapshot(1, run_id='other'))
    await store.append_event(event(5))
    await store.record_tool_effect(effect('t-run'))
    await store.save_snapshot(snapshot(1))
    for name in ('events.jsonl', 'tool_effects.jsonl'):
        with (tmp_path / 'run' / name).open('ab') as file:
            file.write((tmp_path / 'other' / name).read_bytes())
    shutil.copy(tmp_path / 'other' / 'snapshots' / '1.json', tmp_path / 'run' / 'snapshots' / '1.json')
    reader = FileStepStore(tmp_path)
    assert [item.step_index for item in await reader.list_events(run_id='run')] == [5]
    assert [item.tool_call_id for item in await reader.list_tool_effects(run_id='run')] == ['t-run']
    assert await reader.get_tool_effect(run_id='run', tool_call_id='t-other') is None
    assert await reader.latest_snapshot(run_id='run') is None
    assert caplog.text.count("of run 'other'") >= 3


def plant_link(link: Path, outside: Path) -> None:
    """Replace `link` (a file or directory of the store) by a symbolic link to a copy of it in `outside`."""
    target = outside / link.name
    if link.is_dir():
        shutil.copytree(link, target)
        shutil.rmtree(link)
    elif link.exists():
        shutil.copy(link, target)
        link.unlink()
    else:
        target.mkdir()
    link.symlink_to(target)


LINKABLE = [
    'run/events.jsonl',
    'run/tool_effects.jsonl',
    'run/snapshots.jsonl',
    'run/run.lock',
    'run/run.json',
    'run/registration.json',
    'run/snapshots',
    'run',
    'LINE/messages.jsonl',
    'LINE/line.lock',
    'LINE/line.json',
    'LINE/users',
    'LINE',
    '@lines',
    '@media',
    '@tmp',
]
"""Paths below a store with one run; `LINE` stands for the directory of the run's history line."""


def resolve(root: Path, name: str) -> Path:
    """The path `name` (from `LINKABLE`) stands for in the store at `root`."""
    line = line_of(root, 'run').relative_to(root)
    return root / name.replace('LINE', str(line))


async def linked_store(tmp_path: Path, name: str) -> tuple[FileStepStore, Path]:
    """A store with one run (events, an effect, a snapshot with media) whose `name` is then a link to `outside`."""
    root = tmp_path / 'store'
    store = FileStepStore(root, fsync=False)
    await store.register_run(RunRecord(run_id='run'))
    await store.append_event(event(0))
    await store.record_tool_effect(effect('t0'))
    await store.save_snapshot(snapshot(1))
    (root / '@tmp').mkdir(exist_ok=True)
    outside = tmp_path / 'outside'
    outside.mkdir()
    plant_link(resolve(root, name), outside)
    return store, outside


@pytest.mark.parametrize('name', LINKABLE)
async def test_writes_never_follow_a_symbolic_link_planted_in_the_store(tmp_path: Path, name: str) -> None:
    store, outside = await linked_store(tmp_path, name)
    before = tree_of(outside)
    for current in (FileStepStore(store.directory, fsync=False), store):
        for write in (
            current.append_event(event(1)),
            current.record_tool_effect(effect('t1')),
            current.save_snapshot(snapshot(2, run_id='run')),
            current.register_run(RunRecord(run_id=f'fresh-{id(current)}')),
        ):
            with contextlib.suppress(ValueError):
                await write
        assert tree_of(outside) == before, 'something was written outside the store'
    if name == '@tmp':
        with pytest.raises(ValueError, match='symbolic link'):
            await store.register_run(RunRecord(run_id='fresh'))
    with contextlib.suppress(ValueError):
        await store.delete_run(run_id='run')
    assert tree_of(outside) == before, 'deleting the run changed something outside the store'


@pytest.mark.parametrize('name', [name for name in LINKABLE if name.startswith(('run', 'LINE'))])
async def test_reads_never_return_what_a_symbolic_link_points_to(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, name: str
) -> None:
    """The linked copy outside gains records of its own: a read refuses the link or skips it, never returns them."""
    store, outside = await linked_store(tmp_path, name)
    decoy = FileStepStore(tmp_path / 'decoy', fsync=False)
    await decoy.register_run(RunRecord(run_id='run', agent_name='decoy'))
    await decoy.append_event(event(0))
    await decoy.append_event(event(99))
    await decoy.record_tool_effect(effect('t99'))
    for step in (1, 2, 3):
        await decoy.save_snapshot(snapshot(step))
    target = outside / resolve(store.directory, name).name
    source = resolve(decoy.directory, name)
    if target.is_dir():
        shutil.rmtree(target)
        shutil.copytree(source, target)
    else:
        shutil.copy(source, target)
    reader = FileStepStore(store.directory, fsync=False)
    seen: list[object] = []
    for read in (
        reader.get_run(run_id='run'),
        reader.list_runs(),
        reader.list_events(run_id='run'),
        reader.list_snapshots(run_id='run'),
        reader.list_tool_effects(run_id='run'),
    ):
        with contextlib.suppress(ValueError):
            seen.append(await read)
    text = repr(seen)
    assert 'decoy' not in text and 'step_index=99' not in text and 't99' not in text and 'seq=3' not in text
