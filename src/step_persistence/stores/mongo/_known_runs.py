"""What a store remembers about recently used runs: that they exist, and the head their next save builds on.

Checking that a run exists then costs one lookup per run per store, and a snapshot save plans
against the remembered head instead of reading the run's view. A run this store registered and
has not saved a snapshot of yet is remembered as `Registered`: its head is its origin's view,
read at its first save (`_heads.py`). A head carries the run's `registration` as its
`incarnation`, which changes when a run is deleted and registered again (perhaps by another
process): every save checks it against the run's counters document.
"""

from __future__ import annotations

from dataclasses import dataclass

from step_persistence._lru import BoundedLru
from step_persistence.records import RunOrigin
from step_persistence.stores._positions import RunHead

__all__ = ['KnownRuns', 'Registered']


@dataclass(frozen=True, slots=True)
class Registered:
    """A run this store registered, with no snapshot saved through it yet."""

    registration: int
    origin: RunOrigin | None


class KnownRuns:
    """The `max_runs` most recently used runs, each with what is known of its head (`None`: only its existence)."""

    def __init__(self, max_runs: int = 256) -> None:
        self._runs: BoundedLru[str, RunHead | Registered | None] = BoundedLru(max_runs)

    def knows(self, run_id: str) -> bool:
        """Whether the run was seen registered (and not deleted through this store since)."""
        return run_id in self._runs

    def head(self, run_id: str) -> RunHead | Registered | None:
        """The run's remembered head (or its registration), if any."""
        return self._runs.get(run_id)

    def add(self, run_id: str) -> None:
        """Remember that the run exists (keeping anything already known)."""
        self._runs.put(run_id, self._runs.get(run_id))

    def remember(self, run_id: str, head: RunHead | Registered) -> None:
        """Remember the run's head (the view its newest save wrote), or its registration by this store."""
        self._runs.put(run_id, head)

    def forget_head(self, run_id: str) -> None:
        """Keep knowing that the run exists, but read its head from the database next time."""
        self._runs.put(run_id, None)

    def discard(self, run_id: str) -> None:
        self._runs.pop(run_id)
