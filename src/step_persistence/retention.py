"""Bounded snapshot retention, shared by every store."""

from __future__ import annotations

from collections.abc import Iterable

from step_persistence.records import SnapshotState

__all__ = ['retained_seqs', 'validate_max_snapshots']


def validate_max_snapshots(value: object) -> int | None:
    """Return `value` if it is `None` or an int >= 1; otherwise raise `ValueError`."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f'max_snapshots_per_run must be None or an int >= 1, got {value!r}')
    return value


def retained_seqs(snapshots: Iterable[tuple[int, SnapshotState]], max_snapshots: int) -> set[int]:
    """The sequence numbers a run keeps: the newest `max_snapshots`, the newest overall and the newest complete.

    `snapshots` are `(seq, state)` pairs in any order. The kept set may exceed `max_snapshots`
    when the newest complete snapshot lies below the window.
    """
    ordered = sorted(snapshots, reverse=True)
    keep = {seq for seq, _ in ordered[:max_snapshots]}
    newest_complete = next((seq for seq, state in ordered if state == 'complete'), None)
    if newest_complete is not None:
        keep.add(newest_complete)
    return keep
