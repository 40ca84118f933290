"""`FileStepStore` built as the seed builds it (issue 19, item 3): `FileStepStore(directory)`,
`max_snapshots_per_run=`, `media_store=S3MediaStore(...)` with `media_threshold_bytes=`, and
`media_store=None`; the defaults it states (64 KiB, media under the store's directory)."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import anyio.to_thread
import pytest
from pydantic_ai.messages import BinaryContent, ModelMessage, ModelMessagesTypeAdapter, ModelRequest, UserPromptPart

from file_store.file_layout import message_lines
from step_persistence import ContinuableSnapshot, FileStepStore, RunRecord
from step_persistence.media import DiskMediaStore, S3MediaStore, media_uri_for
from support.servers.s3 import S3Server, s3_server

__all__ = ['s3_server']

pytestmark = pytest.mark.anyio

IMAGE = bytes(range(256)) * 4


def history(*texts: str) -> list[ModelMessage]:
    return [
        ModelRequest(parts=[UserPromptPart(content=['look', BinaryContent(data=IMAGE, media_type='image/png')])])
    ] + [ModelRequest(parts=[UserPromptPart(content=text)]) for text in texts]


def blob_names(directory: Path) -> list[str]:
    return sorted(path.name for path in directory.glob('*.bin'))


def dump(messages: list[ModelMessage]) -> bytes:
    return ModelMessagesTypeAdapter.dump_json(messages)


async def save(store: FileStepStore, messages: list[ModelMessage], run_id: str = 'r', step: int = 1) -> None:
    if await store.get_run(run_id=run_id) is None:
        await store.register_run(RunRecord(run_id=run_id))
    await store.save_snapshot(ContinuableSnapshot(run_id=run_id, step_index=step, messages=messages))


async def test_a_directory_alone_keeps_media_under_it_from_64_kib(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    store = FileStepStore('runs')
    assert (store.media_threshold_bytes, store.max_snapshots_per_run) == (64 * 1024, None)
    assert isinstance(store.media_store, DiskMediaStore) and store.media_store.directory == Path('runs', '@media')
    messages = history('a' * (64 * 1024 - 1), 'b' * 64 * 1024)
    await save(store, messages)
    blobs = blob_names(Path('runs', '@media'))
    assert blobs == sorted(f'{media_uri_for(data)[-64:]}.bin' for data in (IMAGE, b'b' * 64 * 1024))
    latest = await FileStepStore(tmp_path / 'runs').latest_snapshot(run_id='r')
    assert latest is not None and dump(latest.messages) == dump(messages)


async def test_max_snapshots_per_run(tmp_path: Path) -> None:
    store = FileStepStore(tmp_path / 'runs', max_snapshots_per_run=8)
    for step in range(1, 11):
        await save(store, history(*(f'step {n}' for n in range(step))), step=step)
    assert [snapshot.seq for snapshot in await store.list_snapshots(run_id='r')] == list(range(3, 11))


async def test_an_s3_media_store_and_a_threshold(tmp_path: Path, s3_server: S3Server) -> None:
    prefix = f'seed-forms-{uuid.uuid4().hex}/'
    store = FileStepStore(
        tmp_path / 'runs',
        media_store=S3MediaStore(
            bucket=s3_server.bucket,
            endpoint=s3_server.endpoint,
            region=s3_server.region,
            access_key_id=s3_server.access_key_id,
            secret_access_key=s3_server.secret_access_key,
            key_prefix=prefix,
        ),
        media_threshold_bytes=64 * 1024,
    )
    messages = history('small', 'x' * 64 * 1024)
    await save(store, messages)
    for data in (IMAGE, b'x' * 64 * 1024):
        response = await anyio.to_thread.run_sync(
            s3_server.request, 'GET', f'/{s3_server.bucket}/{prefix}{media_uri_for(data)[-64:]}.bin'
        )
        assert (response.status_code, response.content) == (200, data)
    assert not (tmp_path / 'runs' / '@media').exists()
    latest = await store.latest_snapshot(run_id='r')
    assert latest is not None and dump(latest.messages) == dump(messages)
    assert store.media_store is not None
    await store.media_store.aclose()  # given, so never closed by the step store


async def test_media_store_none_keeps_everything_inline(tmp_path: Path) -> None:
    store = FileStepStore(tmp_path / 'runs', media_store=None)
    assert store.media_store is None
    messages = history('y' * 100_000)
    await save(store, messages)
    assert not (tmp_path / 'runs' / '@media').exists()
    lines = [json.loads(line) for line in message_lines(tmp_path / 'runs', 'r')]
    assert [line['externalized'] for line in lines] == [False, False]
    latest = await store.latest_snapshot(run_id='r')
    assert latest is not None and dump(latest.messages) == dump(messages)
