"""`ActiveWorkflow`: one durable run's journal, as it replays completed units and journals the others."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from pydantic_ai.exceptions import CallDeferred

from step_persistence._active import ACTIVE_RUN
from step_persistence._cancellation import run_to_completion
from step_persistence._replay import InFlightRefusal
from step_persistence.durable.children import DELEGATING_UNIT, DelegatingUnit, child_workflow_id
from step_persistence.durable.errors import InFlightUnitError, ReplayDivergedError
from step_persistence.durable.fingerprints import MessageDigests
from step_persistence.durable.leases import Lease
from step_persistence.durable.policies import METADATA_KEY, UnitPolicy
from step_persistence.durable.protocol import JournalStore
from step_persistence.durable.records import DurableUnit, Fence, UnitKind, WorkflowRecord
from step_persistence.records import utc_now
from step_persistence.stores._media import MessageMedia

__all__ = ['ACTIVE_WORKFLOW', 'ActiveWorkflow', 'InFlightCallRefused', 'UnitCounts']


class InFlightCallRefused(CallDeferred, InFlightRefusal):
    """A tool call that was in flight when its run stopped, handed back unrun by its `ask` policy.

    The run ends with `DeferredToolRequests` for it, as for any `CallDeferred`; its ledger record
    (`InFlightRefusal`) is what the orchestrator decides on.
    """


@dataclass
class UnitCounts:
    """What happened to the units of one run: the replay counters tests and callers read."""

    replayed: int = 0
    """Completed units whose recorded result was returned (their bodies did not run)."""
    executed: int = 0
    """Units whose bodies ran (for the first time, or again)."""
    rerun: int = 0
    """Of those, units that were in flight when an earlier run stopped."""


@dataclass
class ActiveWorkflow:
    """The journal of one durable run: the units stored when it started, and the ordinals of its unit keys."""

    journal: JournalStore
    record: WorkflowRecord
    stored: Mapping[str, DurableUnit]
    media: MessageMedia
    """Where the media of a unit's result goes (as a snapshot's does), and from what size."""
    lease: Lease | None = None
    """The lease the run holds: its writes are fenced by it, and it starts no unit once the lease is lost."""
    counts: UnitCounts = field(default_factory=UnitCounts)
    digests: MessageDigests = field(default_factory=MessageDigests)
    handed_back: list[str] = field(default_factory=list[str])
    """The in-flight calls its `ask` policy handed back unrun (described), in the order they were."""
    _ordinals: dict[tuple[str, str], int] = field(default_factory=dict[tuple[str, str], int])

    @property
    def workflow_id(self) -> str:
        return self.record.workflow_id

    @property
    def _fence(self) -> Fence | None:
        return None if self.lease is None else self.lease.fence

    def unit_key(self, name: str, discriminator: str) -> str:
        """`<name>#<discriminator>#<ordinal>`: the same for the same unit of every replay."""
        ordinal = self._ordinals.get((name, discriminator), 0)
        self._ordinals[(name, discriminator)] = ordinal + 1
        return f'{name}#{discriminator}#{ordinal}'

    async def run_unit(
        self,
        *,
        key: str,
        name: str,
        kind: UnitKind,
        body: Callable[[], Awaitable[object]],
        fingerprint: str | None = None,
        tool_call_id: str | None = None,
        policy: UnitPolicy,
        describe: str,
    ) -> object:
        """The unit's recorded result if it completed, else its body's, journaled `started` first."""
        if self.lease is not None:
            await self.lease.check()
        stored = self.stored.get(key)
        if stored is not None and stored.status == 'completed':
            if fingerprint is not None and stored.fingerprint is not None and stored.fingerprint != fingerprint:
                raise ReplayDivergedError(
                    workflow_id=self.workflow_id, unit_key=key, what=f'the inputs of {describe} are not those journaled'
                )
            if stored.externalized and self.media.store is None:
                raise ValueError(
                    f'durable workflow {self.workflow_id!r}: the result of {describe} (unit {key!r}) keeps its media '
                    'in a media store, and this store was opened without one: open it with its media store'
                )
            self.counts.replayed += 1
            return await self.media.unpack(stored.result, externalized=stored.externalized)
        in_flight = stored is not None and stored.status == 'started'
        if in_flight:
            await self._decide_in_flight(key, policy, describe=describe, tool_call_id=tool_call_id)
            self.counts.rerun += 1
        started = DurableUnit(
            workflow_id=self.workflow_id,
            unit_key=key,
            name=name,
            kind=kind,
            status='started',
            tool_call_id=tool_call_id,
            fingerprint=fingerprint,
        )
        # To its end, so that a body never runs before its `started` record is stored.
        await run_to_completion(self.journal.record_unit(started, fence=self._fence))
        self.counts.executed += 1
        # A delegate run started in a tool's body is a child workflow of this unit (`durable/children.py`).
        delegating = None if tool_call_id is None else DelegatingUnit(self.workflow_id, key, tool_call_id)
        token = DELEGATING_UNIT.set(delegating)
        try:
            result = await body()
        except asyncio.CancelledError:
            # Cancelled mid-way (a sibling failed, the run timed out): its effect is uncertain, so it stays in
            # flight and its policy decides at the next run.
            raise
        except BaseException as error:
            failed = started.model_copy(update={'status': 'failed', 'error': repr(error), 'ended_at': utc_now()})
            await run_to_completion(self.journal.record_unit(failed, fence=self._fence))
            raise
        finally:
            DELEGATING_UNIT.reset(token)
        payload, externalized = await self.media.pack_changed(result)
        completed = started.model_copy(
            update={'status': 'completed', 'result': payload, 'externalized': externalized, 'ended_at': utc_now()}
        )
        await run_to_completion(self.journal.record_unit(completed, fence=self._fence))
        return result

    async def _decide_in_flight(self, key: str, policy: UnitPolicy, *, describe: str, tool_call_id: str | None) -> None:
        if policy.in_flight == 'rerun':
            return
        if not policy.explicit and tool_call_id is not None and await self._delegated(tool_call_id):
            # Its child's journal decides for the child's units: the tool's body runs again and the child replays.
            return
        if policy.in_flight == 'fail' or tool_call_id is None:
            raise InFlightUnitError(workflow_id=self.workflow_id, unit_key=key, call=describe)
        details: dict[str, Any] = {'reason': 'in_flight', 'workflow_id': self.workflow_id, 'unit_key': key}
        active = ACTIVE_RUN.get()
        if active is not None:
            effect = await active.store.get_tool_effect(run_id=active.run_id, tool_call_id=tool_call_id)
            if effect is not None:
                details['idempotency_key'] = effect.idempotency_key
                details['effect_summary'] = effect.effect_summary
        self.handed_back.append(describe)
        raise InFlightCallRefused(metadata={METADATA_KEY: details})

    async def _delegated(self, tool_call_id: str) -> bool:
        """Whether the tool call started a child workflow (its first delegate run, under its derived id)."""
        child = await self.journal.get_workflow(workflow_id=child_workflow_id(self.workflow_id, tool_call_id))
        parent = None if child is None else child.inputs.get('parent')
        return isinstance(parent, dict) and parent.get('workflow_id') == self.workflow_id


ACTIVE_WORKFLOW: ContextVar[ActiveWorkflow | None] = ContextVar('step_persistence_active_workflow', default=None)
"""The durable run the current task belongs to, set by `StepDurability.wrap_run`."""
