"""Leases: a durable run holds its workflow's lease while it runs, renewed by a heartbeat.

A run claims the lease when it starts (`begin_workflow`) or runs under one that
`recover_abandoned` claimed for it (`RECOVERY_LEASE`). Every journal write of the run is fenced by
the lease's epoch, and the run starts no unit once the lease is lost: another process may have
claimed the workflow after it expired, and only one process may resume it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import socket
from collections.abc import AsyncIterator, Callable
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import datetime, timedelta

from step_persistence._cancellation import run_to_completion
from step_persistence.durable.errors import LeaseLostError, WorkflowHeldError
from step_persistence.durable.protocol import JournalStore
from step_persistence.durable.records import Fence, WorkflowRecord
from step_persistence.records import utc_now

__all__ = ['DEFAULT_LEASE', 'HEARTBEATS_PER_LEASE', 'RECOVERY_LEASE', 'Clock', 'Lease', 'begin_workflow', 'new_owner']

logger = logging.getLogger('step_persistence.durable')

Clock = Callable[[], datetime]
"""What time it is (aware UTC); leases compare each process's clock with the expiry the holder wrote."""

DEFAULT_LEASE = timedelta(seconds=30)
"""How long a lease lasts without a heartbeat: how long a crashed run waits before it can be recovered."""

HEARTBEATS_PER_LEASE = 3
"""A live run renews its lease this many times per lease duration."""


def new_owner() -> str:
    """A lease owner unique to one claim: `<host>:<pid>:<random>` (the host and pid for people reading it)."""
    return f'{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(8)}'


@dataclass
class Lease:
    """The lease one run holds on its workflow: its fence, and until when this process believes it holds it."""

    journal: JournalStore
    workflow_id: str
    fence: Fence
    duration: timedelta
    expires_at: datetime
    clock: Clock = utc_now
    lost: bool = False
    """Set once a renewal found another owner or epoch: the run starts no unit after that."""

    async def renew(self) -> bool:
        """Move the expiry one duration on, if the lease is still held; whether it is (else `lost`)."""
        expires_at = self.clock() + self.duration
        renewed = await run_to_completion(
            self.journal.renew_lease(workflow_id=self.workflow_id, fence=self.fence, lease_expires_at=expires_at)
        )
        if renewed:
            self.expires_at = expires_at
        else:
            self.lost = True
        return renewed

    async def check(self) -> None:
        """Before a unit: `LeaseLostError` if the lease is lost; renewed first if it expired by this clock.

        So a run whose heartbeat fell behind (a blocked event loop, an unreachable store) starts no unit on
        a lease another process may already be claiming.
        """
        if not self.lost and self.clock() >= self.expires_at:
            await self.renew()
        if self.lost:
            raise LeaseLostError(workflow_id=self.workflow_id, owner=self.fence.owner, epoch=self.fence.epoch)

    @contextlib.asynccontextmanager
    async def heartbeat(self) -> AsyncIterator[None]:
        """Renew the lease `HEARTBEATS_PER_LEASE` times per duration while the block runs; stopped at its end."""
        beating = asyncio.create_task(self._beat(), name=f'lease heartbeat of {self.workflow_id!r}')
        try:
            yield
        finally:
            beating.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await beating

    async def _beat(self) -> None:
        interval = self.duration.total_seconds() / HEARTBEATS_PER_LEASE
        while not self.lost:
            await asyncio.sleep(interval)
            try:
                await self.renew()
            except Exception:  # the store is unreachable: tried again at the next beat, `check` refuses units
                logger.warning('could not renew the lease of durable workflow %r', self.workflow_id, exc_info=True)
        logger.warning(
            'durable workflow %r: this run (owner %r) lost its lease; it stops at its next unit',
            self.workflow_id,
            self.fence.owner,
        )


RECOVERY_LEASE: ContextVar[Lease | None] = ContextVar('step_persistence_recovery_lease', default=None)
"""A lease `recover_abandoned` claimed for the run it is about to start: the run holds it instead of claiming."""


async def begin_workflow(
    journal: JournalStore, record: WorkflowRecord, *, duration: timedelta, clock: Clock, take_over: bool = False
) -> tuple[WorkflowRecord, Lease]:
    """Start `record`'s workflow holding its lease: the workflow as stored, and the lease.

    A workflow not stored yet is stored claimed (epoch 1); a stored one is claimed (its lease free or
    expired) and started again; under `RECOVERY_LEASE` for this workflow, the run holds that lease.
    `WorkflowHeldError` (nothing written) if another process holds it. With `take_over` (a child
    workflow, started inside a unit of a parent whose lease this process holds), the lease is claimed
    whoever holds it (`claim_workflow(take_over=True)`): only a stale run of the same parent can hold
    it, and the new epoch fences that run's writes.
    """
    workflow_id = record.workflow_id
    recovered = RECOVERY_LEASE.get()
    if recovered is not None and recovered.workflow_id == workflow_id:
        RECOVERY_LEASE.set(None)  # a run inside this one (a delegate of the same id) claims for itself
        return await journal.start_workflow(record), recovered
    owner = new_owner()
    now = clock()
    expires_at = now + duration

    async def claim() -> WorkflowRecord | None:
        return await journal.claim_workflow(
            workflow_id=workflow_id, owner=owner, lease_expires_at=expires_at, now=now, take_over=take_over
        )

    def held_by_owner(stored: WorkflowRecord) -> Lease:
        if stored.owner != owner:
            raise WorkflowHeldError(
                workflow_id=workflow_id, owner=stored.owner, lease_expires_at=stored.lease_expires_at
            )
        fence = Fence(owner=owner, epoch=stored.fencing_epoch)
        return Lease(journal, workflow_id, fence, duration=duration, expires_at=expires_at, clock=clock)

    claimed = await claim()
    if claimed is None:  # its first start, stored claimed, unless another process's first start comes first
        first = record.model_copy(update={'owner': owner, 'lease_expires_at': expires_at, 'fencing_epoch': 1})
        stored = await journal.start_workflow(first)
        if take_over and stored.owner != owner:  # the other first start is taken over (this one counted an attempt)
            taken = await claim()
            stored = stored if taken is None else taken
        return stored, held_by_owner(stored)
    lease = held_by_owner(claimed)
    return await journal.start_workflow(record), lease
