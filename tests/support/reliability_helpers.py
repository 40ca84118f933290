"""Helpers of the hypothesis-driven reliability tests: running examples on the test's event loop, a sentinel run."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import anyio.from_thread
import anyio.to_thread
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from step_persistence import ContinuableSnapshot, RunRecord, StepEvent, StepStore, ToolEffectRecord
from step_persistence.testing.conformance import T0, sample_history
from support.crash_ledger import fingerprint

EXAMPLES = settings(
    max_examples=20,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


async def for_examples(
    strategy: st.SearchStrategy[Any],
    check: Callable[[Any], Awaitable[None]],
    *,
    always: Sequence[Any] = (),
    max_examples: int = EXAMPLES.max_examples,
) -> None:
    """Run `check` on `always`, then on `max_examples` examples of `strategy`, on this event loop (where the
    stores live).

    Hypothesis drives a synchronous function in a worker thread, which hands each example back.
    """

    def run(value: Any) -> None:
        anyio.from_thread.run(check, value)

    for value in always:
        run = example(value=value)(run)
    await anyio.to_thread.run_sync(settings(EXAMPLES, max_examples=max_examples)(given(value=strategy)(run)))


# --- the sentinel: a run that must never change ---


async def write_sentinel(store: StepStore) -> Callable[[], Awaitable[None]]:
    """Write a run with every kind of record; returns a check that it still reads back identically."""
    await store.register_run(RunRecord(run_id='sentinel', conversation_id='c', metadata={'k': 'v'}, started_at=T0))
    await store.append_event(StepEvent(run_id='sentinel', kind='run_started', step_index=0, timestamp=T0))
    await store.save_snapshot(ContinuableSnapshot(run_id='sentinel', step_index=1, messages=sample_history(2)))
    await store.record_tool_effect(
        ToolEffectRecord(run_id='sentinel', tool_call_id='t1', tool_name='pay', status='started', started_at=T0)
    )

    async def read() -> tuple[Any, ...]:
        snapshots = await store.list_snapshots(run_id='sentinel', include_interrupted=True)
        return (
            await store.get_run(run_id='sentinel'),
            await store.list_events(run_id='sentinel'),
            [(s.seq, s.state, fingerprint(s.messages)) for s in snapshots],
            await store.list_unresolved_tool_effects(run_id='sentinel'),
        )

    original = await read()

    async def unchanged() -> None:
        assert await read() == original, 'the sentinel run changed'

    return unchanged
