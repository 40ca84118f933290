"""What a durable engine tells `StepPersistence` about the run it journals (a `ContextVar`).

`StepDurability` sets it around each of its runs; `StepPersistence` reads it so that a replayed run
leaves one record, not two: the run registers with the workflow's first start time (so a replay's
registration is the same registration), and a tool call the journal holds as completed writes no
`started` ledger record over its terminal one.
"""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass
from datetime import datetime

__all__ = ['DURABLE_RUN', 'DurableRun', 'durable_run_of']


@dataclass(frozen=True)
class DurableRun:
    """A run under durable replay, as its journal stood when the run started."""

    run_id: str
    """pydantic-ai's `run_id` of the run (its workflow id)."""
    started_at: datetime
    """When the workflow first started: every replay of it registers with this time."""
    completed_tool_calls: frozenset[str]
    """The tool calls the journal holds as completed: a replay returns their results without running them."""


DURABLE_RUN: ContextVar[DurableRun | None] = ContextVar('step_persistence_durable_run', default=None)


def durable_run_of(run_id: str | None) -> DurableRun | None:
    """The durable run with pydantic-ai's `run_id`, if the current task is in one (not a delegate's parent's)."""
    durable = DURABLE_RUN.get()
    return durable if durable is not None and durable.run_id == run_id else None
