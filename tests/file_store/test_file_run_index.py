"""The file store's run index (`@runs/`): `list_runs` without a conversation reads only what it returns.

Reads are counted by the store itself (`io_counters.files_read`, `directories_listed`), as in
`test_file_conversations.py`: "bounded" means the same count among 100 runs as among 2,000.
Crash cases are made by hand, as a crashed registration, filling or deletion leaves them.
"""

from __future__ import annotations

import os
import shutil
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from step_persistence import FileStepStore, RunRecord, StepEvent
from step_persistence.records import RunOrigin
from step_persistence.stores._listing import RunFilter
from step_persistence.stores.file._layout import start_of

pytestmark = pytest.mark.anyio

T0 = datetime(2026, 7, 1, tzinfo=UTC)
HERE = Path(__file__).parent


def every_file(root: Path) -> dict[str, bytes | None]:
    return {os.fspath(path.relative_to(root)): None if path.is_dir() else path.read_bytes() for path in root.rglob('*')}


async def _fill(store: FileStepStore, count: int) -> list[tuple[RunRecord, int]]:
    """`count` runs of two agents, started out of registration order (ties included)."""
    registered = []
    for number in range(count):
        record = RunRecord(
            run_id=f'run-{number:05d}',
            agent_name='w' if number % 3 else 'r',
            parent_run_id='root' if number % 5 == 0 else None,
            started_at=T0 + timedelta(seconds=(number * 7919) % (count // 2)),
        )
        await store.register_run(record)
        registered.append((record, number))
    return registered


async def _three_runs(store: FileStepStore) -> None:
    for minute in range(3):
        record = RunRecord(run_id=f'r{minute}', agent_name='a', started_at=T0 + timedelta(minutes=minute))
        await store.register_run(record)


async def _cost(store: FileStepStore, call: Any) -> tuple[Any, tuple[int, int]]:
    before = store.io_counters.files_read, store.io_counters.directories_listed
    result = await call()
    return result, (store.io_counters.files_read - before[0], store.io_counters.directories_listed - before[1])


async def test_the_newest_runs_of_a_large_store_read_only_those(tmp_path: Path) -> None:
    costs = []
    for count in (100, 2_000):
        registered = await _fill(FileStepStore(tmp_path / str(count), fsync=False), count)
        store = FileStepStore(tmp_path / str(count), fsync=False)  # a fresh reader: nothing cached
        for options in (
            {'newest_first': True},
            {'newest_first': False},
            {'agent_name': 'w', 'newest_first': True},
        ):
            found, cost = await _cost(store, partial(store.list_runs, limit=20, **options))
            assert found == RunFilter(limit=20, **options).select(registered)
            costs.append(cost)
        assert all(cost == (20, 1) for cost in costs), costs
    assert costs[:3] == costs[3:], 'the same reads among 100 runs as among 2,000'


async def test_a_runs_delegates_and_continuations_read_only_those(tmp_path: Path) -> None:
    costs = []
    for count in (100, 1_000):
        store = FileStepStore(tmp_path / str(count), fsync=False)
        await store.register_run(RunRecord(run_id='root', started_at=T0 - timedelta(days=1)))
        registered = await _fill(store, count)
        for number in range(3):
            origin = RunOrigin(kind='forked' if number else 'continued', run_id='root', seq=number + 1)
            record = RunRecord(run_id=f'went-on-{number}', origin=origin, started_at=T0 + timedelta(days=1))
            await store.register_run(record)
            registered.append((record, count + number))
        reader = FileStepStore(tmp_path / str(count), fsync=False)
        for options in (
            {'parent_run_id': 'root', 'limit': 5, 'newest_first': True},
            {'origin_run_id': 'root'},
            {'origin_run_id': 'root', 'limit': 1, 'newest_first': True},
        ):
            found, cost = await _cost(reader, partial(reader.list_runs, **options))
            assert found == RunFilter(**options).select(registered)
            costs.append(cost)
    assert costs[:3] == costs[3:] == [(5, 1), (3, 1), (1, 1)], costs


async def test_other_filters_combine_with_the_index(tmp_path: Path) -> None:
    registered = await _fill(FileStepStore(tmp_path, fsync=False), 60)
    store = FileStepStore(tmp_path, fsync=False)
    for options in (
        {'run_id_prefix': 'run-0001'},
        {'parent_run_id': 'root', 'newest_first': True, 'limit': 3},
        {'agent_name': 'r', 'run_id_prefix': 'run-0002'},
        {},
    ):
        assert await store.list_runs(**options) == RunFilter(**options).select(registered)
    found, cost = await _cost(store, partial(store.list_runs, run_id_prefix='run-0001'))
    assert len(found) == 10 and cost == (10, 1), 'the prefix is tested on the entries, before any read'


async def test_entries_left_by_crashes_never_count(tmp_path: Path) -> None:
    store = FileStepStore(tmp_path, fsync=False)
    await _three_runs(store)
    entries = tmp_path / '@runs' / 'all'
    # A registration that crashed after indexing, before its directory appeared: an entry without its run.
    staged = tmp_path / 'staged-run.json'
    staged.write_text(RunRecord(run_id='ghost', started_at=T0 + timedelta(hours=1)).model_dump_json())
    os.link(staged, entries / f'{start_of(T0 + timedelta(hours=1)):019d}.{1:020d}.ghost')
    # A deletion that crashed after its run's directory went, before the entries did.
    [gone] = [name for name in os.listdir(entries) if name.endswith('.r1')]
    os.rename(tmp_path / 'r1', tmp_path / '@tmp' / 'deleted-by-hand')
    # A run deleted and registered again, its old registration's entry left by a crash.
    [old] = [name for name in os.listdir(entries) if name.endswith('.r0')]
    kept_old = tmp_path / 'old-entry'
    os.link(entries / old, kept_old)
    await store.delete_run(run_id='r0')
    os.link(kept_old, entries / old)
    await store.register_run(RunRecord(run_id='r0', started_at=T0 + timedelta(minutes=5)))

    reader = FileStepStore(tmp_path, fsync=False)
    assert [run.run_id for run in await reader.list_runs()] == ['r2', 'r0']
    assert [run.run_id for run in await reader.list_runs(newest_first=True, limit=1)] == ['r0']
    assert [run.run_id for run in await reader.list_runs(agent_name='a')] == ['r2']
    assert gone in os.listdir(entries), 'reading wrote nothing'


async def test_a_copy_made_without_hard_links_lists_every_run(tmp_path: Path) -> None:
    store = FileStepStore(tmp_path / 'store', fsync=False)
    await _three_runs(store)
    shutil.copytree(tmp_path / 'store', tmp_path / 'copy')  # hard links become files
    copy = FileStepStore(tmp_path / 'copy', fsync=False)
    assert [run.run_id for run in await copy.list_runs(newest_first=True)] == ['r2', 'r1', 'r0']
    await copy.register_run(RunRecord(run_id='r3', agent_name='a', started_at=T0 + timedelta(minutes=3)))
    assert [run.run_id for run in await copy.list_runs(agent_name='a', limit=2, newest_first=True)] == ['r3', 'r2']


async def test_a_run_copied_in_by_hand_is_listed_once_the_store_is_indexed_again(tmp_path: Path) -> None:
    """Registration makes a run's entries before its directory appears, so in an indexed store only a run
    directory copied in from elsewhere has none: it is not listed until `@runs/complete` is removed and the
    next write indexes every run again."""
    other = FileStepStore(tmp_path / 'other', fsync=False)
    await other.register_run(RunRecord(run_id='foreign', started_at=T0))
    store = FileStepStore(tmp_path / 'store', fsync=False)
    await store.register_run(RunRecord(run_id='mine', started_at=T0 + timedelta(minutes=1)))
    shutil.copytree(tmp_path / 'other' / 'foreign', tmp_path / 'store' / 'foreign')
    assert [run.run_id for run in await store.list_runs()] == ['mine']
    assert await store.get_run(run_id='foreign') is not None

    (tmp_path / 'store' / '@runs' / 'complete').unlink()
    reader = FileStepStore(tmp_path / 'store', fsync=False)
    assert [run.run_id for run in await reader.list_runs()] == ['foreign', 'mine'], 'read the slow way'
    await reader.register_run(RunRecord(run_id='next', started_at=T0 + timedelta(minutes=2)))
    assert (tmp_path / 'store' / '@runs' / 'complete').exists()
    found, cost = await _cost(reader, partial(reader.list_runs))
    assert [run.run_id for run in found] == ['foreign', 'mine', 'next'] and cost == (3, 1)


@pytest.mark.parametrize('same_start', [False, True])
async def test_a_bare_run_filled_in_is_listed_once(tmp_path: Path, same_start: bool) -> None:
    store = FileStepStore(tmp_path, fsync=False)
    await store.append_event(StepEvent(run_id='bare', kind='run_started', step_index=0, timestamp=T0))
    await store.register_run(RunRecord(run_id='before', started_at=T0 - timedelta(minutes=1)))
    assert [run.run_id for run in await store.list_runs()] == ['before', 'bare']
    started = T0 if same_start else T0 + timedelta(minutes=1)
    filled = RunRecord(run_id='bare', agent_name='a', parent_run_id='before', started_at=started)
    await store.register_run(filled)
    assert await store.list_runs() == [await store.get_run(run_id='before'), filled]
    assert await store.list_runs(agent_name='a') == await store.list_runs(parent_run_id='before') == [filled]
    assert len([name for name in os.listdir(tmp_path / '@runs' / 'all') if name.endswith('.bare')]) == 1


async def test_deleting_runs_takes_them_out_of_the_index(tmp_path: Path) -> None:
    store = FileStepStore(tmp_path, fsync=False)
    await _three_runs(store)
    await store.register_run(
        RunRecord(run_id='child', parent_run_id='r1', origin=RunOrigin(kind='forked', run_id='r1', seq=1))
    )
    await store.delete_run(run_id='child')
    await store.delete_run(run_id='r1')
    assert [run.run_id for run in await store.list_runs(agent_name='a')] == ['r0', 'r2']
    assert await store.list_runs(parent_run_id='r1') == await store.list_runs(origin_run_id='r1') == []
    for kind in ('parents', 'origins'):
        [directory] = os.listdir(tmp_path / '@runs' / kind)
        assert os.listdir(tmp_path / '@runs' / kind / directory) == []
    assert sorted(name.rsplit('.', 1)[1] for name in os.listdir(tmp_path / '@runs' / 'all')) == ['r0', 'r2']


@pytest.mark.parametrize('fixture', ['legacy_store', 'wrapped_store'])
async def test_a_directory_written_before_the_index_is_read_then_indexed_by_its_first_write(
    tmp_path: Path, fixture: str
) -> None:
    directory = tmp_path / 'store'
    shutil.copytree(HERE / fixture, directory, ignore=shutil.ignore_patterns('README.md'))
    before = every_file(directory)
    reader = FileStepStore(directory, fsync=False)
    listed = await reader.list_runs()
    newest = await reader.list_runs(newest_first=True, limit=2)
    assert every_file(directory) == before, 'reading wrote nothing (no index, no marker)'
    assert newest == listed[::-1][:2]

    store = FileStepStore(directory, fsync=False)
    new = RunRecord(run_id='new', started_at=max(run.started_at for run in listed) + timedelta(days=1))
    await store.register_run(new)
    assert (directory / '@runs' / 'complete').exists(), 'the first write indexed every run'
    fresh = FileStepStore(directory, fsync=False)
    found, cost = await _cost(fresh, partial(fresh.list_runs))
    assert found == [*listed, new] and cost == (len(listed) + 1, 1)
    assert await fresh.list_runs(newest_first=True, limit=2) == [new, listed[-1]]


async def test_pruning_reads_only_the_runs_older_than_the_cutoff(tmp_path: Path) -> None:
    registered = await _fill(FileStepStore(tmp_path, fsync=False), 200)
    store = FileStepStore(tmp_path, fsync=False)
    cutoff = T0 + timedelta(seconds=5)
    older, cost = await _cost(store, partial(store.runs_started_before, cutoff))
    expected = [record for record in RunFilter().select(registered) if record.started_at < cutoff]
    assert older == expected and cost == (len(expected), 1)
    pruned = await store.prune_runs(older_than=cutoff, statuses=None, include_running=True)
    assert sorted(pruned) == sorted(record.run_id for record in expected)
    assert await store.list_runs() == [record for record in RunFilter().select(registered) if record not in expected]
