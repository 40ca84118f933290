"""`JournalStore`: what a store holds for durable replay, next to the `StepStore` protocol.

A durable workflow is written once (`start_workflow`: the first start wins, atomically, and
later starts read it back), its units as they run (`record_unit`), and its end. The memory store
implements it itself; `step_persistence.durable.journals.journal_for` finds the journal of any
store that has one.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from step_persistence.durable.records import DurableUnit, WorkflowRecord, WorkflowStatus

__all__ = ['JournalStore']


@runtime_checkable
class JournalStore(Protocol):
    """The durable journal of one store (async; every backend identical, checked by `JournalConformance`)."""

    async def start_workflow(self, record: WorkflowRecord) -> WorkflowRecord:
        """Store `record` unless its workflow is stored; return the stored one (the first start wins).

        A workflow already stored gets `attempts` one higher and, when it is not `running`, `running`
        again; its other fields (code version, inputs, creation time) stay as first written.
        """
        ...

    async def get_workflow(self, *, workflow_id: str) -> WorkflowRecord | None:
        """The stored workflow, or `None`."""
        ...

    async def end_workflow(self, *, workflow_id: str, status: WorkflowStatus) -> None:
        """Set the workflow's status (`LookupError` if it is not stored)."""
        ...

    async def record_unit(self, unit: DurableUnit) -> None:
        """Write `unit` by `(workflow_id, unit_key)`, by `next_unit_state`: a `completed` unit never changes.

        `LookupError` if its workflow is not stored.
        """
        ...

    async def list_units(self, *, workflow_id: str) -> list[DurableUnit]:
        """The workflow's units, in the order they first started (ties by `unit_key`)."""
        ...

    async def delete_workflow(self, *, workflow_id: str) -> None:
        """Remove the workflow and its units (nothing if it is not stored)."""
        ...
