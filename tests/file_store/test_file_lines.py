"""History lines of the file store: which rows views use, saves that find their head gone, numbering."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import AbstractContextManager
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic_ai.messages import ModelMessage, ModelMessagesTypeAdapter

from file_store.file_layout import line_of, messages_of, stored_message_lines
from step_persistence import ContinuableSnapshot, FileStepStore, RunRecord
from step_persistence.records import RunOrigin
from step_persistence.stores.file._lines import LineIndex
from step_persistence.stores.file._message_journal import MessageVersion
from step_persistence.stores.file._usage import used_numbers
from step_persistence.testing.conformance.conversations import chat_history

pytestmark = pytest.mark.anyio


def dump(messages: list[ModelMessage]) -> bytes:
    return ModelMessagesTypeAdapter.dump_json(messages)


# --- which rows views use ---

rows = st.lists(st.integers(min_value=0, max_value=6), max_size=30)
"""The position of each row, in number order (row `n + 1` holds `rows[n]`)."""
views = st.lists(st.tuples(st.integers(min_value=0, max_value=8), st.integers(min_value=0, max_value=32)), max_size=12)


def _versions(positions: list[int]) -> list[list[MessageVersion]]:
    versions: list[list[MessageVersion]] = [[] for _ in range(max(positions, default=-1) + 1)]
    for number, position in enumerate(positions, start=1):
        versions[position].append(MessageVersion(number, f'{number}', (0, 0)))
    return versions


@settings(max_examples=400)
@given(positions=rows, chosen=views)
def test_used_numbers_are_the_rows_some_view_picks(positions: list[int], chosen: list[tuple[int, int]]) -> None:
    versions = _versions(positions)
    expected = set()
    for length, through in chosen:
        for position in range(min(length, len(versions))):
            picked = [version.number for version in versions[position] if version.number <= through]
            if picked:
                expected.add(picked[-1])
    assert used_numbers(versions, chosen) == expected


# --- saves ---


async def _save(store: FileStepStore, run_id: str, messages: list[ModelMessage], step: int = 1) -> None:
    await store.save_snapshot(ContinuableSnapshot(run_id=run_id, step_index=step, messages=messages))


async def test_a_save_whose_origin_went_meanwhile_writes_its_whole_history(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The origin is deleted between finding the head and taking its line: the line stays (another
    run uses it), but the view the head named is no longer kept, so the save starts a line of its own."""
    store = FileStepStore(tmp_path, fsync=False)
    await store.register_run(RunRecord(run_id='a', conversation_id='c'))
    await _save(store, 'a', chat_history(2))
    await store.register_run(RunRecord(run_id='keeper', origin=RunOrigin(kind='continued', run_id='a', seq=1)))
    await _save(store, 'keeper', chat_history(3))
    await store.register_run(RunRecord(run_id='late', origin=RunOrigin(kind='forked', run_id='a', seq=1)))
    shared = line_of(tmp_path, 'a')

    locked = store._lines.locked
    deleted: list[str] = []

    def deleting_first(line: Any, *, exclusive: bool) -> AbstractContextManager[LineIndex]:
        if exclusive and not deleted:
            deleted.append('a')
            store._delete_run('a')  # in the save's worker thread, before it takes the line's lock
        return locked(line, exclusive=exclusive)

    monkeypatch.setattr(store._lines, 'locked', deleting_first)
    late = chat_history(2) + chat_history(1, tag='-late', start=2)
    await _save(store, 'late', late)
    assert deleted == ['a']
    line = line_of(tmp_path, 'late')
    assert line != shared and json.loads((line / 'line.json').read_text()) == {'base': None}
    assert len(messages_of(tmp_path, 'late').read_bytes().splitlines()) == len(late)
    monkeypatch.undo()
    await store.collect_media(grace=timedelta(0))
    reader = FileStepStore(tmp_path)
    for run_id, history in (('late', late), ('keeper', chat_history(3))):
        latest = await reader.latest_snapshot(run_id=run_id)
        assert latest is not None and dump(latest.messages) == dump(history)


async def test_a_shorter_history_on_the_same_view_writes_no_row(tmp_path: Path) -> None:
    store = FileStepStore(tmp_path, fsync=False)
    await store.register_run(RunRecord(run_id='r'))
    await _save(store, 'r', chat_history(3))
    await store.register_run(RunRecord(run_id='other', origin=RunOrigin(kind='continued', run_id='r', seq=1)))
    await _save(store, 'other', chat_history(4))
    await _save(store, 'r', chat_history(2), step=2)  # the line moved on, but nothing needs writing
    assert stored_message_lines(tmp_path) == 8 and len(list((tmp_path / '@lines').iterdir())) == 1
    stored = await FileStepStore(tmp_path).list_snapshots(run_id='r')
    assert [dump(item.messages) for item in stored] == [dump(chat_history(3)), dump(chat_history(2))]


def _planted_rows(path: Path) -> Iterator[int]:
    for line in path.read_bytes().splitlines():
        yield json.loads(line)['no']


async def test_compaction_keeps_the_newest_row_so_no_number_is_given_twice(tmp_path: Path) -> None:
    store = FileStepStore(tmp_path, max_snapshots_per_run=1, fsync=False)
    await store.register_run(RunRecord(run_id='r'))
    await _save(store, 'r', chat_history(2))
    await _save(store, 'r', chat_history(1) + chat_history(1, tag='-again', start=1), step=2)
    messages = messages_of(tmp_path, 'r')
    with messages.open('ab') as file:  # the rows of a save that crashed before its commit
        file.write(messages.read_bytes().splitlines()[-1].replace(b'"no":6', b'"no":7') + b'\n')
    assert list(_planted_rows(messages)) == [1, 2, 3, 4, 5, 6, 7]
    collected = await store.collect_media(grace=timedelta(0))
    assert collected.messages == 2, 'rows 3 and 4 (snapshot 1 only); row 7 is unused but holds the numbering'
    assert list(_planted_rows(messages)) == [1, 2, 5, 6, 7]
    history = chat_history(1) + chat_history(2, tag='-again', start=1)
    await _save(store, 'r', history, step=3)
    assert line_of(tmp_path, 'r') != messages.parent, 'the line moved on past the view: the save branches'
    latest = await FileStepStore(tmp_path).latest_snapshot(run_id='r')
    assert latest is not None and dump(latest.messages) == dump(history)
