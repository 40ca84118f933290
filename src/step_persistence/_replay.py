"""What a durable engine tells `StepPersistence` about the run it journals (a `ContextVar`).

An agent with a `WorkflowEngine` (`StepDurability`) is recorded under its workflow id, pydantic-ai's
`run_id` (`journals_runs_of`), so that the record and the workflow have one id. `StepDurability`
sets `DURABLE_RUN` around each of its runs; `StepPersistence` reads it so that a replayed run
leaves one record, not two, and writes only what that record lacks: the run registers with the
workflow's first start time (so a replay's registration is the same registration), a tool call the
journal holds as completed writes no `started` ledger record over its terminal one, and a call the
engine refuses to run again (`InFlightRefusal`: handed back by `ask`, or failing the run by `fail`) writes no
terminal one over the evidence its interrupted run left.
"""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass
from datetime import datetime
from typing import Any

__all__ = [
    'DURABLE_RUN',
    'DurableRun',
    'InFlightRefusal',
    'WorkflowEngine',
    'durable_run_of',
    'journals_runs_of',
]


class WorkflowEngine:
    """Mixed into a durability capability whose runs are workflows keyed by their `run_id` (`StepDurability`)."""


def journals_runs_of(agent: object) -> bool:
    """Whether `agent`'s capabilities include a `WorkflowEngine`: its runs are then recorded under their `run_id`."""
    from pydantic_ai.capabilities import AbstractCapability  # imported by the run that asks, not by a read

    root = getattr(agent, 'root_capability', None)
    if not isinstance(root, AbstractCapability):
        return False
    found: list[bool] = []

    def visit(capability: AbstractCapability[Any]) -> None:
        if isinstance(capability, WorkflowEngine):
            found.append(True)

    root.apply(visit)
    return bool(found)


@dataclass(frozen=True)
class DurableRun:
    """A run under durable replay, as its journal stood when the run started."""

    run_id: str
    """pydantic-ai's `run_id` of the run (its workflow id)."""
    started_at: datetime
    """When the workflow first started: every replay of it registers with this time."""
    completed_tool_calls: frozenset[str]
    """The tool calls the journal holds as completed: a replay returns their results without running them."""
    replaying: bool = False
    """Whether the journal held units of the workflow (an earlier run of it got that far): the run's record may
    then hold the writes this run queues, which it does not write again (`StoredWrites`)."""


DURABLE_RUN: ContextVar[DurableRun | None] = ContextVar('step_persistence_durable_run', default=None)


def durable_run_of(run_id: str | None) -> DurableRun | None:
    """The durable run with pydantic-ai's `run_id`, if the current task is in one (not a delegate's parent's)."""
    durable = DURABLE_RUN.get()
    return durable if durable is not None and durable.run_id == run_id else None


class InFlightRefusal(Exception):
    """Raised for a tool call that was in flight when its run stopped, which the durable engine does not run again.

    Its ledger record stays as the interrupted run left it (`started`: the effect is unknown, with
    the tool's idempotency key and effect summary): `StepPersistence` ends the call with its
    `tool_call_failed` event only, so `list_unresolved_tool_effects` still shows it.
    """
