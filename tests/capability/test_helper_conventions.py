"""One calling convention for every helper: the store first (positional or keyword), the rest by keyword."""

from __future__ import annotations

import pytest

from step_persistence import (
    ContinuableSnapshot,
    InMemoryStepStore,
    RunRecord,
    ToolEffectRecord,
    continue_run,
    fork_run,
    inspect_recovery,
)
from step_persistence.testing.conformance import sample_history

pytestmark = pytest.mark.anyio


async def test_helpers_take_the_store_positionally_or_by_keyword() -> None:
    store = InMemoryStepStore()
    await store.register_run(RunRecord(run_id='r'))
    await store.save_snapshot(ContinuableSnapshot(run_id='r', step_index=1, messages=sample_history(1)))
    positional = await inspect_recovery(store, run_id='r')
    assert positional == await inspect_recovery(store=store, run_id='r')
    assert await continue_run(store, run_id='r') == await continue_run(store=store, run_id='r')
    assert await fork_run(store, run_id='r') == await fork_run(store=store, run_id='r')


async def test_inspect_recovery_of_an_unknown_run_raises_lookup_error_like_continue_run() -> None:
    store = InMemoryStepStore()
    with pytest.raises(LookupError, match='nope'):
        await inspect_recovery(store, run_id='nope')
    with pytest.raises(LookupError, match='nope'):
        await continue_run(store, run_id='nope')


async def test_the_recovery_report_answers_to_the_seeds_names() -> None:
    store = InMemoryStepStore()
    await store.register_run(RunRecord(run_id='r'))
    await store.save_snapshot(ContinuableSnapshot(run_id='r', step_index=1, messages=sample_history(1)))
    await store.record_tool_effect(ToolEffectRecord(run_id='r', tool_call_id='c', tool_name='pay', status='started'))
    report = await inspect_recovery(store, run_id='r')
    assert report.latest is report.latest_snapshot is not None
    assert report.settled is report.latest_complete_snapshot
    assert report.unresolved == report.unresolved_effects == [await store.get_tool_effect(run_id='r', tool_call_id='c')]
    assert (report.completed, report.failed) == (report.completed_tools, report.failed_tools) == ([], [])
