"""`FileStepStore.collect_media` rewriting `messages.jsonl`: other stores on the directory follow."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from pydantic_ai.messages import (
    BinaryContent,
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelRequest,
    ModelResponse,
    TextPart,
    UserPromptPart,
)

from file_store.file_layout import messages_of
from step_persistence import ContinuableSnapshot, FileStepStore, MediaCollection, RunRecord

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return 'asyncio'


T0 = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


def _history(step: int) -> list[ModelMessage]:
    """Three messages; the last two differ at every step (the history does not grow)."""
    image = BinaryContent(data=f'step {step}'.encode() * 10_000, media_type='image/png')
    return [
        ModelRequest(parts=[UserPromptPart(content='start', timestamp=T0)]),
        ModelResponse(parts=[TextPart(content=f'look {step}')], timestamp=T0),
        ModelRequest(parts=[UserPromptPart(content=[f'see {step}', image], timestamp=T0)]),
    ]


def _dump(snapshot: ContinuableSnapshot | None) -> object:
    assert snapshot is not None
    return ModelMessagesTypeAdapter.dump_python(snapshot.messages, mode='json')


async def test_other_stores_on_the_directory_read_and_write_after_a_rewrite(tmp_path: Path) -> None:
    writer = FileStepStore(tmp_path, max_snapshots_per_run=1, fsync=False)
    other = FileStepStore(tmp_path, max_snapshots_per_run=1, fsync=False)  # its own index, like another process
    await writer.register_run(RunRecord(run_id='r'))
    for step in (1, 2):
        await writer.save_snapshot(ContinuableSnapshot(run_id='r', step_index=step, messages=_history(step)))
    assert _dump(await other.latest_snapshot(run_id='r')) == _dump(
        ContinuableSnapshot(run_id='r', step_index=2, messages=_history(2))
    )
    messages = messages_of(tmp_path, 'r')
    lines_before = messages.read_bytes().count(b'\n')

    assert await writer.collect_media(grace=timedelta(0)) == MediaCollection(messages=2, blobs=1)
    assert messages.read_bytes().count(b'\n') == lines_before - 2

    await other.save_snapshot(ContinuableSnapshot(run_id='r', step_index=3, messages=_history(3)))
    expected = _dump(ContinuableSnapshot(run_id='r', step_index=3, messages=_history(3)))
    assert _dump(await writer.latest_snapshot(run_id='r')) == expected
    assert _dump(await other.latest_snapshot(run_id='r')) == expected
    assert await other.collect_media(grace=timedelta(0)) == MediaCollection(messages=2, blobs=1)
    assert _dump(await writer.latest_snapshot(run_id='r')) == expected


async def test_views_come_from_the_journal_so_a_damaged_snapshot_file_loses_nothing(tmp_path: Path) -> None:
    store = FileStepStore(tmp_path, max_snapshots_per_run=1, fsync=False)
    await store.register_run(RunRecord(run_id='r'))
    for step in (1, 2):
        await store.save_snapshot(ContinuableSnapshot(run_id='r', step_index=step, messages=_history(step)))
    snapshot_file = tmp_path / 'r' / 'snapshots' / '2.json'
    written = snapshot_file.read_bytes()
    snapshot_file.write_text('{broken')
    assert (await store.collect_media(grace=timedelta(0))).messages == 2  # snapshot 1's own rows
    snapshot_file.write_bytes(written)
    expected = _dump(ContinuableSnapshot(run_id='r', step_index=2, messages=_history(2)))
    assert _dump(await FileStepStore(tmp_path).latest_snapshot(run_id='r')) == expected


async def test_a_line_whose_user_cannot_be_read_is_left_as_it_is(tmp_path: Path) -> None:
    store = FileStepStore(tmp_path, max_snapshots_per_run=1, fsync=False)
    await store.register_run(RunRecord(run_id='r'))
    for step in (1, 2):
        await store.save_snapshot(ContinuableSnapshot(run_id='r', step_index=step, messages=_history(step)))
    journal = tmp_path / 'r' / 'snapshots.jsonl'
    outside = tmp_path / 'outside.jsonl'
    journal.rename(outside)
    journal.symlink_to(outside)
    lines = list((tmp_path / '@lines').iterdir())
    contents = [(line / 'messages.jsonl').read_bytes() for line in lines]
    assert (await store.collect_media(grace=timedelta(0))).messages == 0
    assert [(line / 'messages.jsonl').read_bytes() for line in lines] == contents
