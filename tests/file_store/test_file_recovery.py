"""FileStepStore after crashes and damage: torn final lines and corrupt snapshot files."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import pytest
from pydantic_ai.messages import ModelMessagesTypeAdapter

from file_store.file_layout import messages_of
from step_persistence import ContinuableSnapshot, FileStepStore, RunRecord, StepEvent, ToolEffectRecord
from step_persistence.testing.conformance import sample_history

pytestmark = pytest.mark.anyio


@pytest.fixture
def caplog(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.WARNING, logger='step_persistence')
    return caplog


def event(step: int, key: str | None = None) -> StepEvent:
    return StepEvent(run_id='run', kind='model_request_started', step_index=step, idempotency_key=key)


def snapshot(step: int, **fields: Any) -> ContinuableSnapshot:
    return ContinuableSnapshot(run_id='run', step_index=step, messages=sample_history(step, tag='run'), **fields)


def effect(call_id: str, status: str, **fields: Any) -> ToolEffectRecord:
    return ToolEffectRecord.model_validate(
        {'run_id': 'run', 'tool_call_id': call_id, 'tool_name': 'mail', 'status': status, **fields}
    )


def tear_last_line(path: Path, keep: int = 7) -> None:
    """Leave only the first `keep` bytes of the last line, as a crash in the middle of an append would."""
    data = path.read_bytes()
    start = data.rstrip(b'\n').rfind(b'\n') + 1
    path.write_bytes(data[: start + keep])


def lines(path: Path) -> list[str]:
    return path.read_text().split('\n')


@pytest.fixture
async def store(tmp_path: Path) -> FileStepStore:
    store = FileStepStore(tmp_path)
    await store.register_run(RunRecord(run_id='run'))
    return store


@pytest.mark.parametrize('reopen', [False, True], ids=['same-store', 'fresh-store'])
async def test_a_torn_event_line_is_ignored_and_later_appends_stay_whole(
    store: FileStepStore, tmp_path: Path, caplog: pytest.LogCaptureFixture, reopen: bool
) -> None:
    for step in range(3):
        await store.append_event(event(step, key=f'k{step}'))
    path = tmp_path / 'run' / 'events.jsonl'
    tear_last_line(path)
    if reopen:
        store = FileStepStore(tmp_path)

    assert [e.step_index for e in await store.list_events(run_id='run')] == [0, 1]
    assert 'torn final line' in caplog.text and 'events.jsonl' in caplog.text

    await store.append_event(event(3, key='k3'))
    await store.append_event(event(4, key='k2'))  # the torn line's key was never committed: k2 is free again
    await store.append_event(event(5, key='k0'))  # ...but k0 was
    assert [e.step_index for e in await store.list_events(run_id='run')] == [0, 1, 3, 4]
    torn, *appended, end = lines(path)[2:]
    assert torn == '{"run_i' and end == ''
    assert [json.loads(line)['step_index'] for line in appended] == [3, 4]


async def test_a_torn_snapshot_journal_line_uncommits_that_snapshot(
    store: FileStepStore, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    await store.save_snapshot(snapshot(1, idempotency_key='s1'))
    await store.save_snapshot(snapshot(2, idempotency_key='s2'))
    tear_last_line(tmp_path / 'run' / 'snapshots.jsonl')
    reopened = FileStepStore(tmp_path)

    latest = await reopened.latest_snapshot(run_id='run')
    assert latest is not None and (latest.seq, latest.step_index) == (1, 1)
    assert 'torn final line' in caplog.text

    await reopened.save_snapshot(snapshot(2, idempotency_key='s2'))  # the replay of the interrupted save
    await reopened.save_snapshot(snapshot(3, idempotency_key='s1'))  # a committed key stays used
    saved = await reopened.list_snapshots(run_id='run')
    assert [(item.seq, item.step_index) for item in saved] == [(1, 1), (2, 2)]
    assert ModelMessagesTypeAdapter.dump_json(saved[-1].messages) == ModelMessagesTypeAdapter.dump_json(
        sample_history(2, tag='run')
    )


async def test_a_torn_message_line_does_not_break_later_snapshots(store: FileStepStore, tmp_path: Path) -> None:
    await store.save_snapshot(snapshot(1))
    messages = messages_of(tmp_path, 'run')
    with messages.open('ab') as file:
        file.write(b'{"no":4,"digest":"abc","message":{"parts":[{"con')  # a save that crashed mid-append
    await store.save_snapshot(snapshot(2))
    await FileStepStore(tmp_path).save_snapshot(snapshot(3))
    for reader in (store, FileStepStore(tmp_path)):
        saved = await reader.list_snapshots(run_id='run')
        assert [len(item.messages) for item in saved] == [3, 5, 7]
    assert all(json.loads(line) for line in lines(messages)[4:-1])


async def test_a_torn_tool_effect_line_leaves_the_previous_state(
    store: FileStepStore, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    await store.record_tool_effect(effect('t1', 'started', effect_summary='sending'))
    await store.record_tool_effect(effect('t1', 'completed'))
    tear_last_line(tmp_path / 'run' / 'tool_effects.jsonl')
    reopened = FileStepStore(tmp_path)
    stored = await reopened.get_tool_effect(run_id='run', tool_call_id='t1')
    assert stored is not None and (stored.status, stored.effect_summary) == ('started', 'sending')
    assert 'torn final line' in caplog.text
    await reopened.record_tool_effect(effect('t1', 'failed'))
    stored = await store.get_tool_effect(run_id='run', tool_call_id='t1')
    assert stored is not None and (stored.status, stored.effect_summary) == ('failed', 'sending')


async def test_a_file_changed_other_than_by_appends_is_read_again(store: FileStepStore, tmp_path: Path) -> None:
    for step in range(3):
        await store.append_event(event(step, key=f'k{step}'))
    path = tmp_path / 'run' / 'events.jsonl'
    path.write_text(lines(path)[0] + '\n')
    await store.append_event(event(9, key='k1'))
    assert [e.step_index for e in await store.list_events(run_id='run')] == [0, 9]


@pytest.mark.parametrize(
    'damage',
    [
        pytest.param(lambda path: path.write_text('{"seq": 3, "run_id": '), id='truncated-json'),
        pytest.param(lambda path: path.write_bytes(os.urandom(64)), id='garbage'),
        pytest.param(
            lambda path: path.write_text(path.read_text().replace('"complete"', '"partial"')), id='unknown-state'
        ),
        pytest.param(
            lambda path: path.write_text(path.read_text().replace('"through_message": 7', '"through_message": 6')),
            id='wrong-history',
        ),
        pytest.param(lambda path: path.unlink(), id='missing'),
    ],
)
async def test_a_corrupt_snapshot_is_skipped_and_reads_fall_back(
    store: FileStepStore, tmp_path: Path, caplog: pytest.LogCaptureFixture, damage: Any
) -> None:
    for step in (1, 2, 3):
        await store.save_snapshot(snapshot(step))
    damage(tmp_path / 'run' / 'snapshots' / '3.json')
    for reader in (store, FileStepStore(tmp_path)):
        caplog.clear()
        latest = await reader.latest_snapshot(run_id='run')
        assert latest is not None and (latest.seq, latest.step_index) == (2, 2)
        assert 'skipping unreadable snapshot' in caplog.text and 'snapshots/3.json' in caplog.text
        assert [item.seq for item in await reader.list_snapshots(run_id='run', include_interrupted=True)] == [1, 2]


async def test_a_snapshot_whose_messages_are_damaged_is_skipped(
    store: FileStepStore, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    await store.save_snapshot(snapshot(1))
    await store.save_snapshot(snapshot(2))
    messages = messages_of(tmp_path, 'run')
    damaged = lines(messages)
    damaged[4] = damaged[4].replace('"parts"', '"pieces"')  # message 5 belongs to snapshot 2 only
    messages.write_text('\n'.join(damaged))
    latest = await FileStepStore(tmp_path).latest_snapshot(run_id='run')
    assert latest is not None and latest.seq == 1
    assert 'skipping unreadable snapshot' in caplog.text


async def test_every_snapshot_unreadable_gives_none(store: FileStepStore, tmp_path: Path) -> None:
    await store.save_snapshot(snapshot(1))
    (tmp_path / 'run' / 'snapshots' / '1.json').write_text('not json')
    assert await store.latest_snapshot(run_id='run', include_interrupted=True) is None
    assert await store.list_snapshots(run_id='run') == []
