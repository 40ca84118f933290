"""The persisted run that encloses the current task, shared through a `ContextVar`.

`StepPersistence.wrap_run` sets it for the duration of a run, so an agent run started inside one of
that run's tools inherits it as its parent, and `annotate_tool_effect` finds the in-flight ledger
record of the tool call it is called from.
"""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass, field

from step_persistence.protocol import StepStore
from step_persistence.records import ToolEffectRecord

__all__ = ['ACTIVE_RUN', 'ActiveRun']


@dataclass
class ActiveRun:
    """A run being persisted, with the ledger records of its tool calls still executing."""

    run_id: str
    store: StepStore
    in_flight: dict[str, ToolEffectRecord] = field(default_factory=dict[str, ToolEffectRecord])
    """`started` records by `tool_call_id`, carrying any annotations made so far."""


ACTIVE_RUN: ContextVar[ActiveRun | None] = ContextVar('step_persistence_active_run', default=None)
