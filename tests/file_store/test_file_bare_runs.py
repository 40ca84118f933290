"""Bare runs on files: a run registered by a write is a run directory whose `registration.json` marks it;
the `register_run` filling it in replaces its `run.json` (linked into its conversation's index) and
unmarks it, and a filling that crashed part way counts exactly when its `run.json` landed."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from step_persistence import ContinuableSnapshot, FileStepStore, RunRecord, StepEvent
from step_persistence.records import RunOrigin
from step_persistence.stores.file._run_files import dump_run_file
from step_persistence.testing.conformance.conversations import chat_history

pytestmark = pytest.mark.anyio

T0 = datetime(2026, 7, 8, 9, 10, 11, tzinfo=UTC)
CONTINUED = RunOrigin(kind='continued', run_id='head', seq=1)
FILLED = RunRecord(run_id='bare', conversation_id='chat', started_at=T0, origin=CONTINUED)
"""Of no agent: indexed once, so an entry whose staged file is gone is linked once, like a `run.json`."""


def registration(run_directory: Path) -> dict[str, object]:
    return json.loads((run_directory / 'registration.json').read_bytes())


def entries(root: Path) -> list[Path]:
    """Every conversation index entry of the store."""
    return sorted(path for path in (root / '@conversations').rglob('*.bare') if path.is_file())


async def stored_with_a_bare_run(root: Path) -> FileStepStore:
    """A store holding run `head` with a snapshot and a bare run `bare` (one event)."""
    store = FileStepStore(root, fsync=False)
    await store.register_run(RunRecord(run_id='head', conversation_id='chat', started_at=T0))
    await store.save_snapshot(ContinuableSnapshot(run_id='head', step_index=1, messages=chat_history(1)))
    await store.append_event(StepEvent(run_id='bare', kind='run_started', step_index=0, timestamp=T0))
    return store


async def test_a_bare_run_is_marked_beside_its_record_until_filled_in(tmp_path: Path) -> None:
    store = await stored_with_a_bare_run(tmp_path)
    run = tmp_path / 'bare'
    assert RunRecord.model_validate_json((run / 'run.json').read_bytes()) == RunRecord(run_id='bare', started_at=T0)
    stamp = registration(run)['registered_ns']
    assert registration(run) == {'registered_ns': stamp, 'bare': True}
    events = (run / 'events.jsonl').read_bytes()
    filled = FILLED.model_copy(update={'agent_name': 'agent'})
    await store.register_run(filled)
    assert RunRecord.model_validate_json((run / 'run.json').read_bytes()) == filled
    assert registration(run) == {'registered_ns': stamp}
    assert (run / 'events.jsonl').read_bytes() == events
    linked = entries(tmp_path)
    assert len(linked) == 2, 'in its conversation, and its agent within it'
    assert all(entry.samefile(run / 'run.json') for entry in linked)
    assert [r.run_id for r in await FileStepStore(tmp_path).list_runs(conversation_id='chat')] == ['head', 'bare']


async def test_a_filling_that_crashed_before_its_run_json_landed_leaves_the_run_bare(tmp_path: Path) -> None:
    store = await stored_with_a_bare_run(tmp_path)
    run = tmp_path / 'bare'
    stamp = registration(run)['registered_ns']
    assert isinstance(stamp, int)
    # The filling claimed the origin and indexed the staged run.json, then the process died; later the
    # staged file went too (its entry is then linked once, like the run's own run.json).
    staged = tmp_path / 'staged-run.json'
    staged.write_bytes(dump_run_file(FILLED))
    incarnation = (run / 'run.lock').read_text()
    with (
        store._origins.claiming(CONTINUED, 'bare', incarnation),
        store._conversations.registering(FILLED, stamp, staged),
    ):
        pass
    staged.unlink()
    reopened = FileStepStore(tmp_path, fsync=False)
    assert await reopened.get_run(run_id='bare') == RunRecord(run_id='bare', started_at=T0)
    assert [r.run_id for r in await reopened.list_runs(conversation_id='chat')] == ['head']
    assert [(s.run_count, s.head_run_id) for s in await reopened.list_conversations()] == [(1, 'head')]
    await reopened.register_run(RunRecord(run_id='tab', origin=CONTINUED))
    assert (await reopened.get_run(run_id='tab')).origin == CONTINUED, 'the crashed claim does not count'  # type: ignore[union-attr]

    await reopened.register_run(FILLED)  # filled in for good: its entries replace the crashed ones
    forked = FILLED.model_copy(update={'origin': CONTINUED.model_copy(update={'kind': 'forked'})})
    assert await reopened.get_run(run_id='bare') == forked
    assert [r.run_id for r in await reopened.list_runs(conversation_id='chat')] == ['head', 'bare']
    assert [(s.run_count, s.head_run_id) for s in await reopened.list_conversations()] == [(2, 'bare')]
    assert all(entry.samefile(run / 'run.json') for entry in entries(tmp_path))


async def test_a_filling_that_crashed_after_its_run_json_landed_counts(tmp_path: Path) -> None:
    await stored_with_a_bare_run(tmp_path)
    run = tmp_path / 'bare'
    filled = RunRecord(run_id='bare', agent_name='agent', started_at=T0)
    (run / 'run.json').write_bytes(dump_run_file(filled))  # registration.json still marks it bare
    reopened = FileStepStore(tmp_path, fsync=False)
    assert await reopened.get_run(run_id='bare') == filled
    with pytest.raises(ValueError, match='already registered'):
        await reopened.register_run(RunRecord(run_id='bare', agent_name='second'))
    assert await reopened.get_run(run_id='bare') == filled
    assert registration(run)['bare'] is True
