"""The journal's records: a durable workflow and the units it ran (see docs/durable.md).

Like `step_persistence.records`, importing this module imports no pydantic-ai: the stores read
and write these records without it.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field

from step_persistence.records import UtcDatetime, utc_now

__all__ = [
    'UNIT_KINDS',
    'UNIT_STATUSES',
    'WORKFLOW_STATUSES',
    'DurableUnit',
    'Fence',
    'UnitKind',
    'UnitStatus',
    'WorkflowRecord',
    'WorkflowStatus',
    'holds_lease',
    'lease_is_free',
    'next_unit_state',
]

WorkflowStatus = Literal['running', 'completed', 'failed']
"""`running` from its first start until a run of it ends; a failed workflow runs again when it is resumed."""

UnitStatus = Literal['started', 'completed', 'failed']
"""`started` is written before the unit's body runs: a unit still `started` after a crash was in flight."""

UnitKind = Literal['model', 'tool', 'capability', 'discovery', 'other']
"""What a unit journals: a model request, a tool call, a capability's durable operation, tool discovery."""

WORKFLOW_STATUSES: frozenset[str] = frozenset(get_args(WorkflowStatus))
UNIT_STATUSES: frozenset[str] = frozenset(get_args(UnitStatus))
UNIT_KINDS: frozenset[str] = frozenset(get_args(UnitKind))


class _JournalRecord(BaseModel):
    model_config = ConfigDict(frozen=True, extra='forbid', defer_build=True)


class WorkflowRecord(_JournalRecord):
    """One durable workflow: an agent run that a later run with the same id resumes.

    A process runs it only while it holds its lease (`owner`, until `lease_expires_at`); each claim of
    the lease increments `fencing_epoch`, and every journal write of the run is fenced by it (`Fence`).
    """

    workflow_id: str
    agent_name: str | None = None
    run_id: str | None = None
    """pydantic-ai's `run_id` of the run: the workflow id, which `StepPersistence` records the run under."""
    status: WorkflowStatus = 'running'
    code_version: str | None = None
    """The version of the code that started the workflow; a replay under another one is refused unless allowed."""
    inputs: dict[str, Any] = Field(default_factory=dict)
    """What the run was started with (its prompt, a fingerprint of its initial history), JSON-compatible."""
    attempts: int = 1
    """How many runs of the workflow started (1 for the first)."""
    owner: str | None = None
    """The process holding the lease (a token unique to each claim); `None` when nobody does."""
    lease_expires_at: UtcDatetime | None = None
    """Until when `owner` holds it; once past, another process may claim the workflow."""
    fencing_epoch: int = 0
    """How many times the lease was claimed (0: never); a stale owner's writes carry an older epoch."""
    created_at: UtcDatetime = Field(default_factory=utc_now)
    updated_at: UtcDatetime = Field(default_factory=utc_now)


class Fence(_JournalRecord):
    """Who writes to a workflow's journal: a fenced write lands only while `owner` holds the lease at `epoch`."""

    owner: str
    epoch: int


class DurableUnit(_JournalRecord):
    """One durable unit of a workflow: written `started` before its body runs, `completed`/`failed` after."""

    workflow_id: str
    unit_key: str
    """Stable within the workflow: the operation's persisted name, then the tool call id or the run step, then an
    ordinal among units with the same name and discriminator."""
    name: str
    """The operation's persisted name (`JournalOperationNamer`)."""
    kind: UnitKind
    status: UnitStatus
    tool_call_id: str | None = None
    """The tool call a `tool` unit ran."""
    fingerprint: str | None = None
    """A digest of the unit's inputs (messages, tool arguments); a replay whose inputs differ is refused."""
    result: Any = None
    """The encoded result of a `completed` unit (JSON-compatible: `JSON_CODEC`'s payload)."""
    externalized: bool = False
    """Whether `result` holds media markers: its media payloads are in the store's media store, as a
    snapshot's are (`step_persistence.media.walker`), and a replay reads them back from there."""
    error: str | None = None
    """Why a `failed` unit failed."""
    attempts: int = 1
    """How many times the body started (a unit in flight at a crash and run again: 2)."""
    started_at: UtcDatetime = Field(default_factory=utc_now)
    ended_at: UtcDatetime | None = None


def next_unit_state(stored: DurableUnit | None, new: DurableUnit) -> DurableUnit | None:
    """The unit a write of `new` over `stored` leaves, or `None` when the write must change nothing.

    A `completed` unit is final: nothing overwrites it (a replay returns its result). A `started`
    write over a `started` or `failed` unit counts one more attempt. Every journal applies this rule,
    the SQL one in its upsert's `WHERE`.
    """
    if stored is None:
        return new
    if stored.status == 'completed':
        return None
    if new.status == 'started':
        return new.model_copy(update={'attempts': stored.attempts + 1})
    return new.model_copy(update={'attempts': stored.attempts, 'started_at': stored.started_at})


def lease_is_free(record: WorkflowRecord, now: datetime) -> bool:
    """Whether a claim (not a take-over) of `record`'s lease at `now` succeeds: nobody holds it, or its expiry is past.

    The memory and file journals apply this rule, the SQL and MongoDB ones in their claim's filter.
    """
    return record.owner is None or record.lease_expires_at is None or record.lease_expires_at <= now


def holds_lease(record: WorkflowRecord, fence: Fence) -> bool:
    """Whether `fence` holds `record`'s lease (a fenced write of it lands)."""
    return record.owner == fence.owner and record.fencing_epoch == fence.epoch
