"""Large payloads of the file store: blobs in `<directory>/@media`, markers in the lines' `messages.jsonl`."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import anyio
import pytest
from pydantic_ai.messages import BinaryContent, ModelMessage, ModelMessagesTypeAdapter, ModelRequest, UserPromptPart

from file_store import file_layout
from step_persistence import ContinuableSnapshot, FileStepStore, RunRecord
from step_persistence.media import DiskMediaStore, media_uri_for
from step_persistence.media.walker import MARKER_KEY
from step_persistence.testing.conformance import T0

pytestmark = pytest.mark.anyio

IMAGE = bytes(range(256)) * 400
TEXT = 'é' * 40_000
"""80 000 UTF-8 bytes: above the default threshold of 64 KiB."""


def prompt(*content: Any) -> ModelRequest:
    return ModelRequest(parts=[UserPromptPart(content=list(content), timestamp=T0)])


def with_payloads(image: bytes = IMAGE, text: str = TEXT) -> list[ModelMessage]:
    return [prompt('describe this', BinaryContent(data=image, media_type='image/png'), text)]


def snapshot(step: int, history: list[ModelMessage], run_id: str = 'r') -> ContinuableSnapshot:
    return ContinuableSnapshot(run_id=run_id, step_index=step, messages=history)


def dump(history: list[ModelMessage]) -> bytes:
    return ModelMessagesTypeAdapter.dump_json(history)


def blob_files(store: FileStepStore) -> list[Path]:
    return sorted(path for path in store.media_directory.rglob('*.bin'))


def message_lines(store: FileStepStore, run_id: str = 'r') -> list[dict[str, Any]]:
    return [json.loads(line) for line in file_layout.message_lines(store.directory, run_id)]


async def test_payloads_go_to_the_media_directory_once_and_come_back_exactly(tmp_path: Path) -> None:
    store = FileStepStore(tmp_path, fsync=False)
    grown = [*with_payloads(), prompt('and again'), *with_payloads()]
    await store.register_run(RunRecord(run_id='r'))
    await store.save_snapshot(snapshot(1, with_payloads()))
    await store.save_snapshot(snapshot(2, grown))
    assert [dump(s.messages) for s in await store.list_snapshots(run_id='r')] == [dump(with_payloads()), dump(grown)]

    assert [path.name for path in blob_files(store)] == sorted(
        f'{media_uri_for(data)[-64:]}.bin' for data in (IMAGE, TEXT.encode())
    )
    lines = message_lines(store)
    assert [line['externalized'] for line in lines] == [True, False, True]
    assert MARKER_KEY in json.dumps(lines[0]['message']) and len(json.dumps(lines[0])) < 2_000


async def test_without_a_media_store_everything_stays_inline(tmp_path: Path) -> None:
    store = FileStepStore(tmp_path, media_store=None, fsync=False)
    await store.register_run(RunRecord(run_id='r'))
    await store.save_snapshot(snapshot(1, with_payloads()))
    latest = await store.latest_snapshot(run_id='r')
    assert latest is not None and dump(latest.messages) == dump(with_payloads())
    assert not store.media_directory.exists()
    assert [line['externalized'] for line in message_lines(store)] == [False]


async def test_the_threshold_decides_which_strings_move(tmp_path: Path) -> None:
    store = FileStepStore(tmp_path, media_threshold_bytes=1000, fsync=False)
    history = [prompt('a' * 999), prompt('b' * 1000)]
    await store.register_run(RunRecord(run_id='r'))
    await store.save_snapshot(snapshot(1, history))
    assert [path.name for path in blob_files(store)] == [f'{media_uri_for(b"b" * 1000)[-64:]}.bin']
    latest = await store.latest_snapshot(run_id='r')
    assert latest is not None and dump(latest.messages) == dump(history)


async def test_a_given_media_store_is_used(tmp_path: Path) -> None:
    elsewhere = DiskMediaStore(tmp_path / 'blobs')
    store = FileStepStore(tmp_path / 'runs', media_store=elsewhere, fsync=False)
    await store.register_run(RunRecord(run_id='r'))
    await store.save_snapshot(snapshot(1, with_payloads()))
    assert await elsewhere.get(media_uri_for(IMAGE)) == IMAGE
    assert not store.media_directory.exists()


async def test_a_missing_blob_makes_its_snapshots_unreadable_and_reads_fall_back(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = FileStepStore(tmp_path, fsync=False)
    plain = [prompt('nothing large')]
    await store.register_run(RunRecord(run_id='r'))
    await store.save_snapshot(snapshot(1, plain))
    await store.save_snapshot(snapshot(2, [*plain, *with_payloads()]))
    (store.media_directory / f'{media_uri_for(IMAGE)[-64:]}.bin').unlink()
    with caplog.at_level(logging.WARNING, logger='step_persistence'):
        latest = await store.latest_snapshot(run_id='r')
        assert latest is not None and latest.seq == 1
        assert [s.seq for s in await store.list_snapshots(run_id='r')] == [1]
    assert any('FileNotFoundError' in record.getMessage() for record in caplog.records)


async def test_a_store_without_a_media_store_skips_what_needs_one(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    writer = FileStepStore(tmp_path, fsync=False)
    plain = [prompt('nothing large')]
    await writer.register_run(RunRecord(run_id='r'))
    await writer.save_snapshot(snapshot(1, plain))
    await writer.save_snapshot(snapshot(2, [*plain, *with_payloads()]))
    reader = FileStepStore(tmp_path, media_store=None, fsync=False)
    with caplog.at_level(logging.WARNING, logger='step_persistence'):
        latest = await reader.latest_snapshot(run_id='r')
    assert latest is not None and latest.seq == 1
    assert any('media store' in record.getMessage() for record in caplog.records)


async def test_pruning_and_deleting_runs_never_delete_media(tmp_path: Path) -> None:
    store = FileStepStore(tmp_path, max_snapshots_per_run=1, fsync=False)
    for run_id in ('first', 'second'):
        await store.register_run(RunRecord(run_id=run_id))
        for step in range(1, 4):
            await store.save_snapshot(snapshot(step, with_payloads(text=f'{TEXT}{step}'), run_id))
    await store.delete_run(run_id='first')
    assert len(blob_files(store)) == 1 + 3, 'the image, and the text of each step'
    latest = await store.latest_snapshot(run_id='second')
    assert latest is not None and dump(latest.messages) == dump(with_payloads(text=f'{TEXT}3'))


async def test_more_concurrent_saves_than_worker_threads_all_finish(tmp_path: Path) -> None:
    store = FileStepStore(tmp_path, fsync=False)
    run_ids = [f'run-{number}' for number in range(60)]
    for run_id in run_ids:
        await store.register_run(RunRecord(run_id=run_id))
    with anyio.fail_after(60):
        async with anyio.create_task_group() as group:
            for number, run_id in enumerate(run_ids):
                history = with_payloads(image=bytes([number]) * 1000)
                group.start_soon(store.save_snapshot, snapshot(1, history, run_id))
    assert len(blob_files(store)) == 60 + 1
    for number, run_id in enumerate(run_ids):
        latest = await store.latest_snapshot(run_id=run_id)
        assert latest is not None and dump(latest.messages) == dump(with_payloads(image=bytes([number]) * 1000))
