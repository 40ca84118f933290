"""`JournalStore`: what a store holds for durable replay, next to the `StepStore` protocol.

A durable workflow is written once (`start_workflow`: the first start wins, atomically, and
later starts read it back), its units as they run (`record_unit`), and its end. A process runs a
workflow only while it holds its lease (`claim_workflow`, `renew_lease`), and every write of the run
is fenced by the lease's epoch, so a stale owner's writes are refused (`LeaseLostError`). The memory store
implements it itself; `step_persistence.durable.journals.journal_for` finds the journal of any
store that has one.
"""

from __future__ import annotations

from datetime import datetime
from typing import Protocol, runtime_checkable

from step_persistence.durable.records import DurableUnit, Fence, WorkflowRecord, WorkflowStatus

__all__ = ['JournalStore']


@runtime_checkable
class JournalStore(Protocol):
    """The durable journal of one store (async; every backend identical, checked by `JournalConformance`)."""

    async def start_workflow(self, record: WorkflowRecord) -> WorkflowRecord:
        """Store `record` unless its workflow is stored; return the stored one (the first start wins).

        A workflow already stored gets `attempts` one higher and, when it is not `running`, `running`
        again; its other fields (code version, inputs, creation time, lease) stay as first written.
        """
        ...

    async def claim_workflow(
        self,
        *,
        workflow_id: str,
        owner: str,
        lease_expires_at: datetime,
        now: datetime,
        running_only: bool = False,
        take_over: bool = False,
    ) -> WorkflowRecord | None:
        """Claim the stored workflow's lease for `owner` until `lease_expires_at`, atomically; the workflow after.

        The claim succeeds only if nobody holds the lease (no owner, or its expiry is at or before `now`),
        or with `take_over` whoever holds it, and, with `running_only`, the workflow is `running`: then
        `owner` and `lease_expires_at` are set and `fencing_epoch` is one higher, so the previous holder's
        fenced writes and renewals are refused from then on. The returned workflow's `owner` says whether
        it did (owners are unique per claim). `None` if the workflow is not stored.
        """
        ...

    async def renew_lease(self, *, fence: Fence, lease_expires_at: datetime, workflow_id: str) -> bool:
        """Move the lease's expiry to `lease_expires_at` if `fence` still holds it (owner and epoch); whether it did."""
        ...

    async def list_abandoned(self, *, now: datetime) -> list[WorkflowRecord]:
        """The `running` workflows whose lease nobody holds at `now` (no owner, or expired), oldest update first."""
        ...

    async def get_workflow(self, *, workflow_id: str) -> WorkflowRecord | None:
        """The stored workflow, or `None`."""
        ...

    async def end_workflow(self, *, workflow_id: str, status: WorkflowStatus, fence: Fence | None = None) -> None:
        """Set the workflow's status and release its lease (`LookupError` if it is not stored).

        With `fence`, only while it holds the lease (`LeaseLostError` otherwise).
        """
        ...

    async def record_unit(self, unit: DurableUnit, *, fence: Fence | None = None) -> None:
        """Write `unit` by `(workflow_id, unit_key)`, by `next_unit_state`: a `completed` unit never changes.

        `LookupError` if its workflow is not stored; with `fence`, `LeaseLostError` (nothing written) unless
        the fence holds the workflow's lease, checked atomically with the write.
        """
        ...

    async def list_units(self, *, workflow_id: str) -> list[DurableUnit]:
        """The workflow's units, in the order they first started (ties by `unit_key`)."""
        ...

    async def delete_workflow(self, *, workflow_id: str) -> None:
        """Remove the workflow and its units (nothing if it is not stored)."""
        ...
