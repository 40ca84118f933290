"""A run's `run.json` (the `RunRecord` itself) and `registration.json` (its stamp), and what reads them."""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from step_persistence import FileStepStore, RunRecord

pytestmark = pytest.mark.anyio

T0 = datetime(2026, 5, 6, 7, 8, 9, tzinfo=UTC)


def wrap(run_directory: Path) -> None:
    """Spell the run's record as a store before issue 19 did: `{"run": ..., "registered_ns": ...}`."""
    record = json.loads((run_directory / 'run.json').read_bytes())
    stamp = json.loads((run_directory / 'registration.json').read_bytes())['registered_ns']
    (run_directory / 'run.json').write_text(json.dumps({'run': record, 'registered_ns': stamp}, indent=2))
    (run_directory / 'registration.json').unlink()


async def test_run_json_is_the_record_and_registration_json_its_stamp(tmp_path: Path) -> None:
    store = FileStepStore(tmp_path, fsync=False)
    records = [RunRecord(run_id=f'r{n}', agent_name='a', conversation_id='c', metadata={'n': str(n)}) for n in range(3)]
    for record in records:
        await store.register_run(record)
    for record in records:
        assert RunRecord.model_validate_json((tmp_path / record.run_id / 'run.json').read_bytes()) == record
    stamps = [json.loads((tmp_path / r.run_id / 'registration.json').read_bytes())['registered_ns'] for r in records]
    assert stamps == sorted(set(stamps)), 'strictly increasing in registration order'


async def test_runs_started_together_list_in_registration_order(tmp_path: Path) -> None:
    """`started_at` orders `list_runs`; runs sharing it are ordered by their registration stamps,
    which are read for those runs only."""
    store = FileStepStore(tmp_path, fsync=False)
    for run_id in ('c', 'a', 'b'):  # registered out of name order, all at T0
        await store.register_run(RunRecord(run_id=run_id, started_at=T0))
    for minute, run_id in enumerate(('x', 'y', 'z'), start=1):
        await store.register_run(RunRecord(run_id=run_id, started_at=T0 + timedelta(minutes=minute)))
    wrap(tmp_path / 'a')  # a mixed directory: the older spelling carries its stamp in run.json

    reader = FileStepStore(tmp_path, fsync=False)
    assert [run.run_id for run in await reader.list_runs()] == ['c', 'a', 'b', 'x', 'y', 'z']
    assert reader.io_counters.files_read == 6, 'every run.json; the index entries name the stamps'
    assert [run.run_id for run in await reader.list_runs(newest_first=True, limit=4)] == ['z', 'y', 'x', 'b']

    (tmp_path / '@runs' / 'complete').unlink()  # as if written before the run index: every run is read
    unindexed = FileStepStore(tmp_path, fsync=False)
    assert [run.run_id for run in await unindexed.list_runs()] == ['c', 'a', 'b', 'x', 'y', 'z']
    assert unindexed.io_counters.files_read == 6 + 2, "every run.json, and the stamps of 'c' and 'b'"
    assert [run.run_id for run in await unindexed.list_runs(newest_first=True, limit=4)] == ['z', 'y', 'x', 'b']


async def test_an_unreadable_stamp_never_hides_the_run(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    store = FileStepStore(tmp_path, fsync=False)
    for run_id in ('first', 'second'):
        await store.register_run(RunRecord(run_id=run_id, started_at=T0, conversation_id='c'))
    (tmp_path / 'second' / 'registration.json').write_text('{"registered_ns": "soon"}')
    caplog.set_level(logging.WARNING, logger='step_persistence')

    reader = FileStepStore(tmp_path, fsync=False)
    assert [run.run_id for run in await reader.list_runs()] == ['first', 'second'], 'the entries name the stamps'
    (tmp_path / '@runs' / 'complete').unlink()  # as if written before the run index: stamps are read
    reader = FileStepStore(tmp_path, fsync=False)
    assert [run.run_id for run in await reader.list_runs()] == ['second', 'first'], 'listed, first among its ties'
    assert 'registration stamp' in caplog.text
    assert (await reader.get_run(run_id='second')) is not None
    assert [run.run_id for run in await reader.list_runs(conversation_id='c')] == ['first', 'second']


async def test_reading_a_wrapped_run_file_never_rewrites_it(tmp_path: Path) -> None:
    store = FileStepStore(tmp_path, fsync=False)
    await store.register_run(RunRecord(run_id='old', conversation_id='c', agent_name='a'))
    wrap(tmp_path / 'old')
    before = (tmp_path / 'old' / 'run.json').read_bytes()
    reader = FileStepStore(tmp_path, fsync=False)
    record = await reader.get_run(run_id='old')
    assert record is not None and (record.conversation_id, record.agent_name) == ('c', 'a')
    assert [run.run_id for run in await reader.list_runs(agent_name='a')] == ['old']
    assert [run.run_id for run in await reader.list_runs(conversation_id='c', agent_name='a')] == ['old']
    await reader.delete_run(run_id='old')
    assert await reader.list_runs(conversation_id='c') == []
    await reader.register_run(RunRecord(run_id='old', conversation_id='c'))
    assert (tmp_path / 'old' / 'run.json').read_bytes() != before
    assert [run.run_id for run in await FileStepStore(tmp_path).list_runs(conversation_id='c')] == ['old']


async def test_wrapped_file_named_another_run_is_foreign(tmp_path: Path) -> None:
    store = FileStepStore(tmp_path, fsync=False)
    await store.register_run(RunRecord(run_id='here'))
    wrap(tmp_path / 'here')
    run_file = tmp_path / 'here' / 'run.json'
    run_file.write_text(run_file.read_text().replace('"here"', '"elsewhere"'))
    with pytest.raises(ValueError, match='holds run'):
        await FileStepStore(tmp_path).get_run(run_id='here')
    with pytest.raises(ValueError, match='holds run'):
        await FileStepStore(tmp_path).list_events(run_id='here')
