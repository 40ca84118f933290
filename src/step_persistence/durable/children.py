"""Delegates as child workflows: a durable agent run started inside a tool unit of a durable run.

The tool unit whose body is running is published in a `ContextVar` (`DELEGATING_UNIT`), so a
delegate agent with its own `StepDurability`, run inside the tool without a `run_id`, gets a
deterministic one (`child_workflow_id`) and records its parent with its inputs: a resumed parent
that runs the tool again finds the child's journal, and the child replays its own completed units.
"""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from step_persistence.run_ids import derive_run_id

__all__ = ['DELEGATING_UNIT', 'DelegatingUnit', 'child_workflow_id']

_FALLBACK_PREFIX = 'delegate'
"""The prefix of a child's id when its parent's id, spelled path-safe, leaves no room for the digest."""


def child_workflow_id(parent_workflow_id: str, tool_call_id: str, ordinal: int = 0) -> str:
    """The workflow id of the `ordinal`-th delegate run (0 for the first) started without a `run_id` inside
    the tool call `tool_call_id` of the workflow `parent_workflow_id`.

    `<parent id>-<16 hex digits>`: the parent's id spelled path-safe (as `derive_run_id` spells an
    agent name), then the start of the SHA-256 of the three; `delegate-<16 hex digits>` when that would
    exceed 200 characters. The same three always give the same id, so a replay's delegate is the same
    workflow; a delegate that is given a `run_id` keeps it.
    """
    discriminator = f'{tool_call_id}\0{ordinal}'
    try:
        return derive_run_id(parent_workflow_id, discriminator)
    except ValueError:
        return derive_run_id(_FALLBACK_PREFIX, f'{parent_workflow_id}\0{discriminator}')


@dataclass
class DelegatingUnit:
    """The tool unit whose body is running in the current task: the parent of a delegate run started there."""

    workflow_id: str
    unit_key: str
    tool_call_id: str
    _children: int = field(default=0, repr=False)

    def next_child_id(self) -> str:
        """The id of the next delegate run started in this unit without a `run_id` (in the order they start)."""
        child = child_workflow_id(self.workflow_id, self.tool_call_id, self._children)
        self._children += 1
        return child

    def as_parent(self) -> dict[str, Any]:
        """How a child workflow records this unit among its inputs (`inputs['parent']`)."""
        return {'workflow_id': self.workflow_id, 'unit_key': self.unit_key, 'tool_call_id': self.tool_call_id}


DELEGATING_UNIT: ContextVar[DelegatingUnit | None] = ContextVar('step_persistence_delegating_unit', default=None)
"""Set by `ActiveWorkflow.run_unit` while a tool unit's body runs; `None` inside a child's own run."""
