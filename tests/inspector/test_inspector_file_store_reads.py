"""The inspector's run list and run page on the file store read the same files among ten times more runs
(issue 20).

The file store has no query plans to check (test_inspector_bounded_reads.py does that for SQL and
MongoDB); its own counters (`io_counters`: files opened to read, directories listed) show that a
page of the run list, with or without an agent, and a run's page with its delegates, read what they
show, through the run index.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from step_persistence import FileStepStore, RunRecord, StepEvent
from step_persistence.inspector.queries import RunFilters, run_detail, runs_page

pytestmark = pytest.mark.anyio

T0 = datetime(2026, 8, 1, tzinfo=UTC)
SMALL, LARGE = 200, 2_000


async def _store(directory: Path, count: int) -> None:
    store = FileStepStore(directory, fsync=False)
    for number in range(count):
        run_id = f'run-{number:05d}'
        moment = T0 + timedelta(seconds=number)
        parent = 'run-00000' if number in (1, 2, 3) else None
        record = RunRecord(
            run_id=run_id, agent_name='a' if number % 2 else 'b', parent_run_id=parent, started_at=moment
        )
        await store.register_run(record)
        await store.append_event(StepEvent(run_id=run_id, kind='run_started', step_index=0, timestamp=moment))


async def test_the_run_list_and_a_run_read_the_same_files_on_a_store_ten_times_larger(tmp_path: Path) -> None:
    costs: dict[int, list[tuple[int, int]]] = {}
    for count in (SMALL, LARGE):
        await _store(tmp_path / str(count), count)
        store = FileStepStore(tmp_path / str(count), fsync=False)  # nothing cached
        costs[count] = []
        for filters, start in ((RunFilters(), 0), (RunFilters(), 40), (RunFilters(agent='a'), 20)):
            before = store.io_counters.files_read, store.io_counters.directories_listed
            page = await runs_page(store, filters, start=start, size=20, now=T0 + timedelta(days=1))
            after = store.io_counters.files_read, store.io_counters.directories_listed
            newest = count - 1 - start * (2 if filters.agent else 1)
            assert page.rows[0].record.run_id == f'run-{newest:05d}'
            assert len(page.rows) == 20 and page.next_start == start + 20
            costs[count].append((after[0] - before[0], after[1] - before[1]))
        before = store.io_counters.files_read, store.io_counters.directories_listed
        detail = await run_detail(store, 'run-00000', now=T0 + timedelta(days=1))
        after = store.io_counters.files_read, store.io_counters.directories_listed
        assert detail is not None and [link.run_id for link in detail.delegates] == [
            'run-00001',
            'run-00002',
            'run-00003',
        ]
        costs[count].append((after[0] - before[0], after[1] - before[1]))
    assert costs[SMALL] == costs[LARGE], costs
