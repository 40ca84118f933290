"""What a store remembers about recently used runs: that they exist, and the head of their stored messages.

Checking that a run exists then costs one lookup per run per store, and a snapshot save compares
its history with the remembered head instead of reading the run's messages. A head carries the
run's `registration` as its `incarnation`, which changes when a run is deleted and registered
again (perhaps by another process): every save checks it against the run's counters document.
"""

from __future__ import annotations

from step_persistence._lru import BoundedLru
from step_persistence.stores._positions import RunHead

__all__ = ['KnownRuns']


class KnownRuns:
    """The `max_runs` most recently used runs, each with its message head (`None`: only its existence)."""

    def __init__(self, max_runs: int = 256) -> None:
        self._runs: BoundedLru[str, RunHead | None] = BoundedLru(max_runs)

    def knows(self, run_id: str) -> bool:
        """Whether the run was seen registered (and not deleted through this store since)."""
        return run_id in self._runs

    def head(self, run_id: str) -> RunHead | None:
        """The run's remembered message head, if any."""
        return self._runs.get(run_id)

    def add(self, run_id: str) -> None:
        """Remember that the run exists (keeping any head already known)."""
        self._runs.put(run_id, self._runs.get(run_id))

    def remember(self, run_id: str, head: RunHead) -> None:
        """Remember the run's message head (which reflects only documents actually stored)."""
        self._runs.put(run_id, head)

    def discard(self, run_id: str) -> None:
        self._runs.pop(run_id)
