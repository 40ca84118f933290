"""`StoredWrites`: what the record of a durably replayed run already holds, so a replayed flush can be skipped.

A replay queues the same writes, under the same idempotency keys, as the run it replays; a flush whose
every write is already stored would change nothing and costs a transaction. Whether it is stored is
decided from three reads made once, when the replay starts (the run's events, its ledger, its latest
snapshot), with the order in which a flush lands: tool effects, then events, then snapshots, and one
flush after the other (a store that does not batch atomically may stop between them). So a flush is
stored when its events are, its ledger records match the stored ones, and its snapshots are followed
by an event of a later flush, or are the latest snapshot stored.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from step_persistence.protocol import StepStore
from step_persistence.records import StepWrites, ToolEffectRecord

__all__ = ['StoredWrites']


@dataclass(frozen=True)
class StoredWrites:
    """The stored record of one run, as a replay of it started."""

    event_positions: Mapping[str, int]
    """Position in the run's event log, by idempotency key."""
    event_count: int
    effects: Mapping[str, ToolEffectRecord]
    """The run's ledger, by tool call id."""
    latest_snapshot_key: str | None
    """The idempotency key of the run's latest snapshot (interrupted ones included)."""

    @classmethod
    async def load(cls, store: StepStore, *, run_id: str) -> StoredWrites:
        events = await store.list_events(run_id=run_id)
        effects = await store.list_tool_effects(run_id=run_id)
        latest = await store.latest_snapshot(run_id=run_id, include_interrupted=True)
        return cls(
            event_positions={
                event.idempotency_key: position
                for position, event in enumerate(events)
                if event.idempotency_key is not None
            },
            event_count=len(events),
            effects={effect.tool_call_id: effect for effect in effects},
            latest_snapshot_key=None if latest is None else latest.idempotency_key,
        )

    def hold(self, writes: StepWrites) -> bool:
        """Whether every write of `writes` is stored already (so applying them would change nothing)."""
        if not writes.events:
            return False  # nothing places it in the log: it cannot be shown stored
        positions = [self.event_positions.get(event.idempotency_key or '') for event in writes.events]
        if any(position is None for position in positions):
            return False
        if not all(self._holds_effect(effect) for effect in writes.tool_effects):
            return False
        if not writes.snapshots:
            return True
        last_event = max(position for position in positions if position is not None)
        followed = last_event < self.event_count - 1  # a later flush's event landed, so all of this flush did
        last_key = writes.snapshots[-1].idempotency_key
        return followed or (last_key is not None and last_key == self.latest_snapshot_key)

    def _holds_effect(self, effect: ToolEffectRecord) -> bool:
        stored = self.effects.get(effect.tool_call_id)
        return (
            stored is not None
            and stored.run_id == effect.run_id
            and stored.tool_name == effect.tool_name
            and stored.status == effect.status
            and effect.idempotency_key in (None, stored.idempotency_key)
            and effect.effect_summary in (None, stored.effect_summary)
        )
