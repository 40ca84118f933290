"""`InMemoryStepStore`: process-local storage with the same semantics as the durable backends."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from step_persistence import lifecycle
from step_persistence._arguments import require_text
from step_persistence._closing import ClosesOnExit
from step_persistence._history import EncodedMessage, decode_messages, history_digest
from step_persistence.durable.errors import LeaseLostError
from step_persistence.durable.records import (
    DurableUnit,
    Fence,
    WorkflowRecord,
    WorkflowStatus,
    holds_lease,
    lease_is_free,
    next_unit_state,
)
from step_persistence.reclaiming import MediaCollection, validate_grace
from step_persistence.records import (
    ContinuableSnapshot,
    ConversationSummary,
    RunRecord,
    SnapshotRef,
    SnapshotState,
    StepEvent,
    StepWrites,
    ToolEffectRecord,
    merge_tool_effect,
)
from step_persistence.retention import retained_seqs, validate_max_snapshots
from step_persistence.stores._bare import Write, bare_record
from step_persistence.stores._listing import ConversationFilter, RunFilter, conversation_summaries
from step_persistence.stores._pruning import PrunesOldRuns

__all__ = ['InMemoryStepStore']


@dataclass
class _StoredSnapshot:
    header: ContinuableSnapshot
    """The snapshot with its `seq` set and its messages left out."""
    messages: tuple[EncodedMessage, ...]
    digest: str | None = None
    """`history_digest`, once `find_snapshot` has asked for it."""

    @property
    def history_digest(self) -> str:
        """The digest of the history, computed when first looked for rather than at every save."""
        if self.digest is None:
            self.digest = history_digest(message.digest for message in self.messages)
        return self.digest


@dataclass
class _RunData:
    record: RunRecord
    registration: int
    bare: bool = False
    """Registered by a write, not yet by `register_run`."""
    events: list[StepEvent] = field(default_factory=list[StepEvent])
    event_keys: set[str] = field(default_factory=set[str])
    snapshots: dict[int, _StoredSnapshot] = field(default_factory=dict[int, _StoredSnapshot])
    snapshot_keys: set[str] = field(default_factory=set[str])
    last_seq: int = 0
    effects: dict[str, ToolEffectRecord] = field(default_factory=dict[str, ToolEffectRecord])


class InMemoryStepStore(PrunesOldRuns, ClosesOnExit):
    """Keeps everything in this process's memory; for tests and short-lived scripts.

    Snapshots are stored as encoded copies, so mutating a history after saving it never changes
    what the store returns. Media stays inline.
    """

    def __init__(self, *, max_snapshots_per_run: int | None = None) -> None:
        self.max_snapshots_per_run = validate_max_snapshots(max_snapshots_per_run)
        self._runs: dict[str, _RunData] = {}
        self._registrations = itertools.count()
        self._continued: dict[tuple[str, int], str] = {}
        """The run stored as the continuation of each continued snapshot `(run_id, seq)`."""
        self._workflows: dict[str, WorkflowRecord] = {}
        self._units: dict[str, dict[str, DurableUnit]] = {}
        """The durable journal (`step_persistence.durable.protocol.JournalStore`): units by workflow, then key."""

    def _run(self, write: Write) -> _RunData:
        """The data of the run `write` is for, registering it bare if it is not stored."""
        data = self._runs.get(write.run_id)
        if data is None:
            data = _RunData(record=bare_record(write), registration=next(self._registrations), bare=True)
            self._runs[write.run_id] = data
        return data

    async def register_run(self, record: RunRecord) -> None:
        """Insert the run, or fill in a bare one (keeping its writes and its place in registration order)."""
        stored = self._runs.get(record.run_id)
        if stored is not None and not stored.bare:
            raise ValueError(f'run {record.run_id!r} is already registered')
        origin = record.origin
        if origin is not None and origin.kind == 'continued' and (origin.run_id, origin.seq) in self._continued:
            record = record.model_copy(update={'origin': origin.model_copy(update={'kind': 'forked'})})
        elif origin is not None and origin.kind == 'continued':
            self._continued[origin.run_id, origin.seq] = record.run_id
        if stored is None:
            self._runs[record.run_id] = _RunData(record=record, registration=next(self._registrations))
        else:
            stored.record, stored.bare = record, False

    async def get_run(self, *, run_id: str) -> RunRecord | None:
        require_text('run_id', run_id)
        data = self._runs.get(run_id)
        return None if data is None else data.record

    async def list_runs(
        self,
        *,
        parent_run_id: str | None = None,
        conversation_id: str | None = None,
        agent_name: str | None = None,
        origin_run_id: str | None = None,
        run_id_prefix: str | None = None,
        limit: int | None = None,
        newest_first: bool = False,
    ) -> list[RunRecord]:
        chosen = RunFilter(
            parent_run_id=parent_run_id,
            conversation_id=conversation_id,
            agent_name=agent_name,
            origin_run_id=origin_run_id,
            run_id_prefix=run_id_prefix,
            limit=limit,
            newest_first=newest_first,
        )
        return chosen.select((data.record, data.registration) for data in self._runs.values())

    async def list_conversations(
        self, *, limit: int | None = None, newest_first: bool = True, agent_name: str | None = None
    ) -> list[ConversationSummary]:
        chosen = ConversationFilter(limit=limit, newest_first=newest_first, agent_name=agent_name)
        return conversation_summaries(((data.record, data.registration) for data in self._runs.values()), chosen)

    async def find_snapshot(self, *, conversation_id: str, history_digest: str) -> SnapshotRef | None:
        require_text('conversation_id', conversation_id)
        require_text('history_digest', history_digest)
        for record in await self.list_runs(conversation_id=conversation_id, newest_first=True):
            data = self._runs[record.run_id]
            for seq in sorted(data.snapshots, reverse=True):
                if data.snapshots[seq].history_digest == history_digest:
                    return SnapshotRef(run_id=record.run_id, seq=seq)
        return None

    async def append_event(self, event: StepEvent) -> None:
        self._append_event(event)

    def _append_event(self, event: StepEvent) -> None:
        data = self._run(event)
        if event.idempotency_key is not None:
            if event.idempotency_key in data.event_keys:
                return
            data.event_keys.add(event.idempotency_key)
        data.events.append(event)

    async def list_events(self, *, run_id: str) -> list[StepEvent]:
        require_text('run_id', run_id)
        data = self._runs.get(run_id)
        return [] if data is None else list(data.events)

    async def save_snapshot(self, snapshot: ContinuableSnapshot) -> None:
        self._save_snapshot(snapshot)

    def _save_snapshot(self, snapshot: ContinuableSnapshot) -> None:
        data = self._run(snapshot)
        key = snapshot.idempotency_key
        if key is not None:
            if key in data.snapshot_keys:
                return
            data.snapshot_keys.add(key)
        data.last_seq += 1
        header = snapshot.model_copy(update={'messages': [], 'seq': data.last_seq})
        data.snapshots[data.last_seq] = _StoredSnapshot(header=header, messages=snapshot.encoded_messages())
        if self.max_snapshots_per_run is not None:
            keep = retained_seqs(
                ((seq, stored.header.state) for seq, stored in data.snapshots.items()), self.max_snapshots_per_run
            )
            for seq in [seq for seq in data.snapshots if seq not in keep]:
                del data.snapshots[seq]

    def _matching(self, run_id: str, include_interrupted: bool) -> list[_StoredSnapshot]:
        require_text('run_id', run_id)
        data = self._runs.get(run_id)
        if data is None:
            return []
        return [
            stored
            for _, stored in sorted(data.snapshots.items())
            if include_interrupted or stored.header.state == 'complete'
        ]

    @staticmethod
    def _materialize(stored: _StoredSnapshot) -> ContinuableSnapshot:
        messages = decode_messages([message.tree() for message in stored.messages])
        return stored.header.model_copy(update={'messages': messages})

    async def latest_snapshot(self, *, run_id: str, include_interrupted: bool = False) -> ContinuableSnapshot | None:
        matching = self._matching(run_id, include_interrupted)
        return self._materialize(matching[-1]) if matching else None

    async def list_snapshots(self, *, run_id: str, include_interrupted: bool = False) -> list[ContinuableSnapshot]:
        return [self._materialize(stored) for stored in self._matching(run_id, include_interrupted)]

    async def list_snapshot_states(self, *, run_id: str) -> list[SnapshotState]:
        return [stored.header.state for stored in self._matching(run_id, include_interrupted=True)]

    async def record_tool_effect(self, record: ToolEffectRecord) -> None:
        self._record_tool_effect(record)

    def _record_tool_effect(self, record: ToolEffectRecord) -> None:
        data = self._run(record)
        data.effects[record.tool_call_id] = merge_tool_effect(data.effects.get(record.tool_call_id), record)

    async def get_tool_effect(self, *, run_id: str, tool_call_id: str) -> ToolEffectRecord | None:
        require_text('run_id', run_id)
        require_text('tool_call_id', tool_call_id)
        data = self._runs.get(run_id)
        return None if data is None else data.effects.get(tool_call_id)

    async def list_unresolved_tool_effects(self, *, run_id: str) -> list[ToolEffectRecord]:
        require_text('run_id', run_id)
        data = self._runs.get(run_id)
        if data is None:
            return []
        unresolved = [record for record in data.effects.values() if record.status == 'started']
        return sorted(unresolved, key=lambda record: record.started_at)

    async def list_tool_effects(self, *, run_id: str) -> list[ToolEffectRecord]:
        require_text('run_id', run_id)
        data = self._runs.get(run_id)
        if data is None:
            return []
        return sorted(data.effects.values(), key=lambda record: (record.started_at, record.tool_call_id))

    async def write_batch(self, writes: StepWrites) -> None:
        """The writes in `StepWrites` order, as the calls one by one would make them (in one turn of the loop)."""
        for effect in writes.tool_effects:
            self._record_tool_effect(effect)
        for event in writes.events:
            self._append_event(event)
        for snapshot in writes.snapshots:
            self._save_snapshot(snapshot)

    async def delete_run(self, *, run_id: str, cascade: bool = False) -> None:
        require_text('run_id', run_id)
        if cascade:
            await lifecycle.delete_delegated_runs(self, run_id)
        self._runs.pop(run_id, None)
        self._continued = {snapshot: run for snapshot, run in self._continued.items() if run != run_id}

    # --- the durable journal (JournalStore) ---

    async def start_workflow(self, record: WorkflowRecord) -> WorkflowRecord:
        require_text('workflow_id', record.workflow_id)
        stored = self._workflows.get(record.workflow_id)
        if stored is None:
            self._workflows[record.workflow_id] = record
            self._units[record.workflow_id] = {}
            return record
        again = stored.model_copy(
            update={'attempts': stored.attempts + 1, 'status': 'running', 'updated_at': record.updated_at}
        )
        self._workflows[record.workflow_id] = again
        return again

    async def get_workflow(self, *, workflow_id: str) -> WorkflowRecord | None:
        require_text('workflow_id', workflow_id)
        return self._workflows.get(workflow_id)

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
        require_text('workflow_id', workflow_id)
        require_text('owner', owner)
        stored = self._workflows.get(workflow_id)
        if (
            stored is None
            or not (take_over or lease_is_free(stored, now))
            or (running_only and stored.status != 'running')
        ):
            return stored
        claimed = stored.model_copy(
            update={
                'owner': owner,
                'lease_expires_at': lease_expires_at,
                'fencing_epoch': stored.fencing_epoch + 1,
                'updated_at': now,
            }
        )
        self._workflows[workflow_id] = claimed
        return claimed

    async def renew_lease(self, *, workflow_id: str, fence: Fence, lease_expires_at: datetime) -> bool:
        require_text('workflow_id', workflow_id)
        stored = self._workflows.get(workflow_id)
        if stored is None or not holds_lease(stored, fence):
            return False
        self._workflows[workflow_id] = stored.model_copy(update={'lease_expires_at': lease_expires_at})
        return True

    async def list_abandoned(self, *, now: datetime) -> list[WorkflowRecord]:
        abandoned = [
            record for record in self._workflows.values() if record.status == 'running' and lease_is_free(record, now)
        ]
        return sorted(abandoned, key=lambda record: (record.updated_at, record.workflow_id))

    def _fenced(self, workflow_id: str, fence: Fence | None) -> WorkflowRecord:
        stored = self._workflows.get(workflow_id)
        if stored is None:
            raise LookupError(f'no durable workflow {workflow_id!r} is stored')
        if fence is not None and not holds_lease(stored, fence):
            raise LeaseLostError(workflow_id=workflow_id, owner=fence.owner, epoch=fence.epoch)
        return stored

    async def end_workflow(self, *, workflow_id: str, status: WorkflowStatus, fence: Fence | None = None) -> None:
        require_text('workflow_id', workflow_id)
        stored = self._fenced(workflow_id, fence)
        self._workflows[workflow_id] = stored.model_copy(
            update={'status': status, 'owner': None, 'lease_expires_at': None}
        )

    async def record_unit(self, unit: DurableUnit, *, fence: Fence | None = None) -> None:
        self._fenced(unit.workflow_id, fence)
        units = self._units[unit.workflow_id]
        written = next_unit_state(units.get(unit.unit_key), unit)
        if written is not None:
            units[unit.unit_key] = written

    async def list_units(self, *, workflow_id: str) -> list[DurableUnit]:
        require_text('workflow_id', workflow_id)
        units = self._units.get(workflow_id, {})
        return sorted(units.values(), key=lambda unit: (unit.started_at, unit.unit_key))

    async def delete_workflow(self, *, workflow_id: str) -> None:
        require_text('workflow_id', workflow_id)
        self._workflows.pop(workflow_id, None)
        self._units.pop(workflow_id, None)

    async def collect_media(self, *, grace: timedelta) -> MediaCollection:
        """Nothing to collect: a snapshot's messages go with it, and media stays inline."""
        validate_grace(grace)
        return MediaCollection(messages=0, blobs=0)

    async def aclose(self) -> None:
        """Nothing to release: the data lives as long as the store object."""
