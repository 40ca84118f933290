"""Lineage for the command line: what went on from a run, and a conversation's runs as a tree.

A run's `RunRecord.origin` names the stored snapshot its history started from; the runs that went
on from a run's snapshots are `list_runs(origin_run_id=...)`. In a conversation, a run hangs
under the run it continued or forked from when that run is in the conversation too; otherwise
(its origin is in another conversation, no longer stored, or, in damaged data, descends from the
run itself) it is a root, and `ConversationRun.origin_outside` says why.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Literal, TypeVar

from step_persistence.protocol import StepStore
from step_persistence.records import OriginKind, RunRecord, ToolEffectRecord, utc_now
from step_persistence.status import RunStatus, run_status

__all__ = [
    'BATCH',
    'Continuation',
    'ConversationRun',
    'OriginOutside',
    'continuations',
    'continuations_of',
    'load_conversation',
]

BATCH = 16
"""Runs read concurrently (a run's status is two reads)."""

Item = TypeVar('Item')
Read = TypeVar('Read')


async def _each(items: Sequence[Item], read: Callable[[Item], Awaitable[Read]]) -> list[Read]:
    """`read` of each item, in order, `BATCH` items at a time."""
    found: list[Read] = []
    for start in range(0, len(items), BATCH):
        found.extend(await asyncio.gather(*(read(item) for item in items[start : start + BATCH])))
    return found


OriginOutside = Literal['other_conversation', 'not_stored', 'cycle']
"""Why a run with an origin is a root of its conversation's tree."""


@dataclass(frozen=True)
class Continuation:
    """A run that went on from one of another run's snapshots."""

    run_id: str
    kind: OriginKind
    seq: int
    """The snapshot (of the other run) it started from."""


async def continuations(store: StepStore, run_id: str) -> list[Continuation]:
    """The runs continued or forked from `run_id`'s snapshots, oldest first (one listing)."""
    return [
        Continuation(run_id=record.run_id, kind=record.origin.kind, seq=record.origin.seq)
        for record in await store.list_runs(origin_run_id=run_id)
        if record.origin is not None
    ]


async def continuations_of(store: StepStore, run_ids: Iterable[str]) -> dict[str, list[Continuation]]:
    """`continuations` of each run."""
    wanted = list(dict.fromkeys(run_ids))
    listed = await _each(wanted, lambda run_id: continuations(store, run_id))
    return dict(zip(wanted, listed, strict=True))


@dataclass
class ConversationRun:
    """One run of a conversation, with its status and where it sits in the conversation's tree."""

    record: RunRecord
    status: RunStatus
    unresolved: list[ToolEffectRecord]
    children: list[str]
    """The runs of the conversation continued or forked from it, oldest first."""
    origin_outside: OriginOutside | None = None
    """Set when the run has an origin but is a root: the origin run is in another conversation (or
    none), is not stored, or descends from this run (a loop, possible only in damaged data)."""

    @property
    def parent_id(self) -> str | None:
        """The run of the conversation it hangs under in the tree, if any."""
        origin = self.record.origin
        return None if origin is None or self.origin_outside is not None else origin.run_id


async def load_conversation(
    store: StepStore, conversation_id: str, *, now: datetime | None = None
) -> list[ConversationRun]:
    """The conversation's runs oldest first (`list_runs` order), each with its status and children.

    `[]` when no run has this `conversation_id`. Reads the runs once, then two reads per run for
    its status and one per origin outside the conversation.
    """
    records = await store.list_runs(conversation_id=conversation_id)
    members = {record.run_id for record in records}
    outside = await _origins_outside(store, records, members)
    statuses = await _statuses(store, records, now=now or utc_now())
    shown = [
        ConversationRun(
            record=record, status=status, unresolved=unresolved, children=[], origin_outside=outside.get(record.run_id)
        )
        for record, (status, unresolved) in zip(records, statuses, strict=True)
    ]
    by_id = {run.record.run_id: run for run in shown}
    for run in shown:
        if run.parent_id is not None:
            by_id[run.parent_id].children.append(run.record.run_id)
    return shown


async def _origins_outside(
    store: StepStore, records: Sequence[RunRecord], members: Collection[str]
) -> dict[str, OriginOutside]:
    """Why each run whose origin does not make it a child is a root."""
    elsewhere = list(
        dict.fromkeys(
            record.origin.run_id
            for record in records
            if record.origin is not None and record.origin.run_id not in members
        )
    )
    stored = await _each(elsewhere, lambda run_id: store.get_run(run_id=run_id))
    kinds: dict[str, OriginOutside] = {
        run_id: 'not_stored' if record is None else 'other_conversation'
        for run_id, record in zip(elsewhere, stored, strict=True)
    }
    outside = {
        record.run_id: kinds[record.origin.run_id]
        for record in records
        if record.origin is not None and record.origin.run_id in kinds
    }
    parents = {
        record.run_id: record.origin.run_id
        for record in records
        if record.origin is not None and record.run_id not in outside
    }
    outside.update(dict.fromkeys(_loop_breakers(parents, [record.run_id for record in records]), 'cycle'))
    return outside


def _loop_breakers(parents: Mapping[str, str], order: Sequence[str]) -> set[str]:
    """The runs whose link to their parent is dropped so that `parents` forms a forest: the oldest of each loop."""
    position = {run_id: index for index, run_id in enumerate(order)}
    done: set[str] = set()
    breakers: set[str] = set()
    for start in order:
        path: list[str] = []
        on_path: set[str] = set()
        node: str | None = start
        while node is not None and node not in done and node not in on_path:
            path.append(node)
            on_path.add(node)
            node = parents.get(node)
        if node is not None and node in on_path:
            loop = path[path.index(node) :]
            breakers.add(min(loop, key=position.__getitem__))
        done.update(path)
    return breakers


async def _statuses(
    store: StepStore, records: Sequence[RunRecord], *, now: datetime
) -> list[tuple[RunStatus, list[ToolEffectRecord]]]:
    """Each run's status and unresolved effects, in order."""

    async def one(record: RunRecord) -> tuple[RunStatus, list[ToolEffectRecord]]:
        unresolved = await store.list_unresolved_tool_effects(run_id=record.run_id)
        return run_status(await store.list_events(run_id=record.run_id), unresolved, now=now), unresolved

    return await _each(records, one)
