"""What a store remembers about recently used runs: that they exist, and the head of their stored messages.

Checking that a run exists then costs one lookup per run per store, and a snapshot save compares
its history with the remembered head instead of reading the run's messages. A head is
remembered with the run's `registration`, which changes when a run is deleted and registered
again (perhaps by another process): every save checks it against the run's counters document.
"""

from __future__ import annotations

from collections import OrderedDict

from step_persistence.stores.mongo._heads import RunHead

__all__ = ['KnownRuns']


class KnownRuns:
    """A bounded, least-recently-used map of run id -> its message head (`None`: only its existence)."""

    def __init__(self, max_runs: int = 256) -> None:
        self._runs: OrderedDict[str, RunHead | None] = OrderedDict()
        self._max_runs = max_runs

    def knows(self, run_id: str) -> bool:
        """Whether the run was seen registered (and not deleted through this store since)."""
        if run_id not in self._runs:
            return False
        self._runs.move_to_end(run_id)
        return True

    def head(self, run_id: str) -> RunHead | None:
        """The run's remembered message head, if any."""
        head = self._runs.get(run_id)
        if head is not None:
            self._runs.move_to_end(run_id)
        return head

    def add(self, run_id: str) -> None:
        """Remember that the run exists (keeping any head already known)."""
        self._store(run_id, self._runs.get(run_id))

    def remember(self, run_id: str, head: RunHead) -> None:
        """Remember the run's message head (which reflects only documents actually stored)."""
        self._store(run_id, head)

    def discard(self, run_id: str) -> None:
        self._runs.pop(run_id, None)

    def _store(self, run_id: str, head: RunHead | None) -> None:
        self._runs[run_id] = head
        self._runs.move_to_end(run_id)
        while len(self._runs) > self._max_runs:
            self._runs.popitem(last=False)
