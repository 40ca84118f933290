"""FileStepStore over hostile and damaged files (issue 16): nothing altered is returned as true,
one damaged line or record never hides the healthy ones, and nothing is written outside the store."""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Any

import pytest
from pydantic_ai.messages import ModelMessagesTypeAdapter

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


def message_lines(tmp_path: Path, run_id: str = 'run') -> list[bytes]:
    return (tmp_path / run_id / 'messages.jsonl').read_bytes().splitlines()


def rewrite_message_line(tmp_path: Path, number: int, old: bytes, new: bytes, run_id: str = 'run') -> None:
    """Replace `old` by `new` in the line of message `number` (exactly once)."""
    path = tmp_path / run_id / 'messages.jsonl'
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


async def test_a_message_every_snapshot_uses_altered_leaves_no_snapshot(store: FileStepStore, tmp_path: Path) -> None:
    await store.save_snapshot(snapshot(1))
    await store.save_snapshot(snapshot(2))
    rewrite_message_line(tmp_path, 1, 'start run'.encode(), b'start rum')
    reader = FileStepStore(tmp_path)
    assert await reader.latest_snapshot(run_id='run', include_interrupted=True) is None
    assert await reader.list_snapshots(run_id='run') == []


async def test_untouched_messages_still_read_back_and_new_saves_work(store: FileStepStore, tmp_path: Path) -> None:
    """The check accepts every line the store wrote, inline and externalized, after compaction too."""
    for step in (1, 2, 3):
        await store.save_snapshot(snapshot(step))
    externalized = [json.loads(line)['externalized'] for line in message_lines(tmp_path)]
    assert True in externalized and False in externalized
    reader = FileStepStore(tmp_path)
    assert [dump(item) for item in await reader.list_snapshots(run_id='run')] == [
        dump(snapshot(step)) for step in (1, 2, 3)
    ]


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
    with (tmp_path / 'run' / 'messages.jsonl').open('ab') as file:
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
