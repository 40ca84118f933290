"""Copying runs between any two stores: `copy_runs` (and `step-persistence copy SRC DST`).

Each run is copied whole, through the `StepStore` protocol only, so any pair of stores works
(file -> SQLite -> PostgreSQL -> MongoDB and back): its record, then its tool effects and events
(one batch), then its snapshots in sequence order, each with its state, step index, timestamp,
lineage and idempotency key. Snapshot messages are read from the source with their media
restored and written through the destination, whose own media store externalizes the large
payloads again, so the blobs arrive too.

Copying is idempotent. A run is compared with what the destination already holds:

- nothing: the run is copied;
- the same record, events, effects and snapshots: skipped;
- the same record and a prefix of the source's data (an earlier copy was interrupted, or the run
  was still being written when it was copied): the destination's run is deleted and copied again;
- anything else (another record under the same id, or data the source does not have): the run
  fails and the destination is left untouched.

Snapshot sequence numbers are assigned by the destination: when the source pruned early
snapshots (retention), the destination numbers the retained ones 1, 2, 3... Snapshots are
compared by their order, never by `seq`. A destination that prunes more than the source
(`max_snapshots_per_run`) cannot hold a copy; such a run fails its verification.

A run's `origin` names a snapshot by its `seq`, so it is translated to the destination's number
of the same snapshot once the origin run is there (runs are copied oldest first, so an origin
comes before the runs continuing it, and the destination shares their stored messages as the
source did). An origin that cannot be translated (its run is not in the destination, or the
source no longer retains that snapshot) is copied as it is.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Literal

from step_persistence.protocol import StepStore, write_steps
from step_persistence.records import ContinuableSnapshot, RunRecord, StepEvent, StepWrites, ToolEffectRecord

__all__ = ['CopyOutcome', 'CopyReport', 'RunCopy', 'SeqMap', 'copy_run', 'copy_runs']

CopyOutcome = Literal['copied', 'skipped', 'failed']
"""`copied`: written to the destination; `skipped`: already there, identical; `failed`: see `RunCopy.error`."""

_SNAPSHOT_BATCH = 16
"""Snapshots written per batch (one transaction on the SQL stores)."""


@dataclass(frozen=True)
class RunCopy:
    """What happened to one run."""

    run_id: str
    outcome: CopyOutcome
    repaired: bool = False
    """The destination held a partial copy of the run, which was deleted and copied again."""
    error: str | None = None
    """Why the run failed (`outcome == 'failed'`)."""


@dataclass
class CopyReport:
    """Every run `copy_runs` looked at, by outcome, each list in copy order (oldest run first)."""

    copied: list[str] = field(default_factory=list[str])
    skipped: list[str] = field(default_factory=list[str])
    failed: dict[str, str] = field(default_factory=dict[str, str])
    """Run id -> why it was not copied."""
    repaired: list[str] = field(default_factory=list[str])
    """Runs (also in `copied`) whose partial copy at the destination was replaced."""

    @property
    def ok(self) -> bool:
        """No run failed."""
        return not self.failed

    def add(self, result: RunCopy) -> None:
        if result.outcome == 'copied':
            self.copied.append(result.run_id)
            if result.repaired:
                self.repaired.append(result.run_id)
        elif result.outcome == 'skipped':
            self.skipped.append(result.run_id)
        else:
            self.failed[result.run_id] = result.error or 'failed'


@dataclass(frozen=True)
class _RunData:
    """Everything a store holds for one run, in a form that compares by content."""

    events: list[StepEvent]
    effects: dict[str, ToolEffectRecord]
    snapshots: list[ContinuableSnapshot]

    @classmethod
    async def read(cls, store: StepStore, run_id: str) -> _RunData:
        events = await store.list_events(run_id=run_id)
        effects = await store.list_tool_effects(run_id=run_id)
        snapshots = await store.list_snapshots(run_id=run_id, include_interrupted=True)
        return cls(events, {effect.tool_call_id: effect for effect in effects}, snapshots)

    def snapshot_keys(self) -> list[tuple[object, ...]]:
        return [_snapshot_key(snapshot) for snapshot in self.snapshots]

    def same_as(self, other: _RunData) -> bool:
        return (
            self.events == other.events
            and self.effects == other.effects
            and self.snapshot_keys() == other.snapshot_keys()
        )

    def is_prefix_of(self, other: _RunData) -> bool:
        """Whether these are the first events and snapshots of `other`, with effects it also has."""
        return (
            self.events == other.events[: len(self.events)]
            and self.effects.keys() <= other.effects.keys()
            and self.snapshot_keys() == other.snapshot_keys()[: len(self.snapshots)]
        )


def _snapshot_key(snapshot: ContinuableSnapshot) -> tuple[object, ...]:
    """Everything a copy preserves of a snapshot (all but `seq`), its messages by the digests of their JSON."""
    return (
        snapshot.step_index,
        snapshot.state,
        snapshot.timestamp,
        snapshot.conversation_id,
        snapshot.parent_run_id,
        snapshot.agent_name,
        snapshot.idempotency_key,
        tuple(encoded.digest for encoded in snapshot.encoded_messages()),
    )


async def _write(destination: StepStore, record: RunRecord, data: _RunData) -> None:
    await destination.register_run(record)
    await write_steps(destination, StepWrites(tool_effects=list(data.effects.values()), events=data.events))
    for start in range(0, len(data.snapshots), _SNAPSHOT_BATCH):
        batch = [
            snapshot.model_copy(update={'seq': None}) for snapshot in data.snapshots[start : start + _SNAPSHOT_BATCH]
        ]
        await write_steps(destination, StepWrites(snapshots=batch))


class SeqMap:
    """Per run, the source's and the destination's snapshot numbers, in snapshot order (read once)."""

    def __init__(self, source: StepStore, destination: StepStore) -> None:
        self._source = source
        self._destination = destination
        self._known: dict[str, tuple[list[int], list[int]]] = {}

    def learn(self, run_id: str, source: _RunData, destination: _RunData) -> None:
        self._known[run_id] = (_seqs(source.snapshots), _seqs(destination.snapshots))

    async def translated(self, record: RunRecord) -> RunRecord:
        """`record` with its origin's `seq` as the destination numbers that snapshot, when it can be told."""
        origin = record.origin
        if origin is None:
            return record
        known = self._known.get(origin.run_id)
        if known is None:
            if await self._destination.get_run(run_id=origin.run_id) is None:
                return record
            known = (
                _seqs(await self._source.list_snapshots(run_id=origin.run_id, include_interrupted=True)),
                _seqs(await self._destination.list_snapshots(run_id=origin.run_id, include_interrupted=True)),
            )
            self._known[origin.run_id] = known
        source_seqs, destination_seqs = known
        if origin.seq not in source_seqs or len(destination_seqs) != len(source_seqs):
            return record
        seq = destination_seqs[source_seqs.index(origin.seq)]
        return record.model_copy(update={'origin': origin.model_copy(update={'seq': seq})})


def _seqs(snapshots: list[ContinuableSnapshot]) -> list[int]:
    return [snapshot.seq for snapshot in snapshots if snapshot.seq is not None]


async def copy_run(
    source: StepStore,
    destination: StepStore,
    record: RunRecord,
    *,
    verify: bool = True,
    seq_map: SeqMap | None = None,
) -> RunCopy:
    """Copy one run (`record`, as the source lists it) unless the destination already has it.

    `seq_map`: what earlier copies learnt of snapshot numbers (`copy_runs` shares one across runs).
    """
    run_id = record.run_id
    data = await _RunData.read(source, run_id)
    seq_map = SeqMap(source, destination) if seq_map is None else seq_map
    record = await seq_map.translated(record)
    repaired = False
    existing = await destination.get_run(run_id=run_id)
    if existing is not None:
        if existing != record:
            return RunCopy(run_id, 'failed', error='the destination holds a different run under this id')
        held = await _RunData.read(destination, run_id)
        if held.same_as(data):
            seq_map.learn(run_id, data, held)
            return RunCopy(run_id, 'skipped')
        if not held.is_prefix_of(data):
            return RunCopy(run_id, 'failed', error='the destination holds data for this run that the source does not')
        await destination.delete_run(run_id=run_id)
        repaired = True
    await _write(destination, record, data)
    written = await _RunData.read(destination, run_id)
    if verify and not written.same_as(data):
        return RunCopy(
            run_id,
            'failed',
            repaired=repaired,
            error='the copy at the destination differs from the source (does the destination prune snapshots?)',
        )
    seq_map.learn(run_id, data, written)
    return RunCopy(run_id, 'copied', repaired=repaired)


async def copy_runs(
    source: StepStore,
    destination: StepStore,
    *,
    run_ids: Collection[str] | None = None,
    on_run: Callable[[RunCopy], object] | None = None,
    verify: bool = True,
) -> CopyReport:
    """Copy every run of `source` (or those in `run_ids`) to `destination`, oldest first.

    Runs the destination already holds identically are skipped; a partial earlier copy is
    replaced; a run that conflicts with the destination's, or that a store refuses (for example a
    metadata key MongoDB cannot hold), fails on its own and the others are still copied.
    `on_run` is called after each run with what happened to it. With `verify` (the default)
    each copied run is read back from the destination and compared with the source.

    Raises `LookupError` (before copying anything) if a run in `run_ids` is not in the source.
    """
    records = await source.list_runs()
    if run_ids is not None:
        wanted = set(run_ids)
        missing = wanted - {record.run_id for record in records}
        if missing:
            raise LookupError(f'run {", ".join(map(repr, sorted(missing)))} does not exist in the source store')
        records = [record for record in records if record.run_id in wanted]
    report = CopyReport()
    seq_map = SeqMap(source, destination)
    for record in records:
        result = await _copy_or_fail(source, destination, record, verify=verify, seq_map=seq_map)
        report.add(result)
        if on_run is not None:
            on_run(result)
    return report


async def _copy_or_fail(
    source: StepStore, destination: StepStore, record: RunRecord, *, verify: bool, seq_map: SeqMap
) -> RunCopy:
    """`copy_run`, with a store's refusal of this run's data as the run's failure.

    `ValueError` is what a store raises for data it cannot hold; connection and other store
    errors propagate, since every later run would fail the same way.
    """
    try:
        return await copy_run(source, destination, record, verify=verify, seq_map=seq_map)
    except ValueError as error:
        return RunCopy(record.run_id, 'failed', error=f'{type(error).__name__}: {error}')
