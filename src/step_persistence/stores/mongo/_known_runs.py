"""What a store remembers about recently used runs: that they exist, and the numbers of their stored messages.

Checking that a run exists then costs one lookup per run per store, and a snapshot save sends
only the messages the run has not stored yet. Message numbers are remembered together with the
run's `registration`, which changes when a run is deleted and registered again (perhaps by
another process): numbers remembered under an older registration must not be used.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ['KnownMessages', 'KnownRuns']


@dataclass
class KnownMessages:
    """Digest -> message number for the messages of one registration of a run that this store knows."""

    registration: int
    numbers: dict[str, int]


class KnownRuns:
    """A bounded, least-recently-used map of run id -> its known messages (`None`: only its existence)."""

    def __init__(self, max_runs: int = 256) -> None:
        self._runs: OrderedDict[str, KnownMessages | None] = OrderedDict()
        self._max_runs = max_runs

    def knows(self, run_id: str) -> bool:
        """Whether the run was seen registered (and not deleted through this store since)."""
        if run_id not in self._runs:
            return False
        self._runs.move_to_end(run_id)
        return True

    def messages(self, run_id: str) -> KnownMessages | None:
        """The run's known message numbers, if any."""
        known = self._runs.get(run_id)
        if known is not None:
            self._runs.move_to_end(run_id)
        return known

    def add(self, run_id: str) -> None:
        """Remember that the run exists (keeping any message numbers already known)."""
        self._store(run_id, self._runs.get(run_id))

    def remember(self, run_id: str, registration: int, numbers: Mapping[str, int]) -> None:
        """Add committed message numbers of the run's registration `registration`."""
        known = self._runs.get(run_id)
        if known is None or known.registration != registration:
            known = KnownMessages(registration=registration, numbers=dict(numbers))
        else:
            known.numbers.update(numbers)
        self._store(run_id, known)

    def discard(self, run_id: str) -> None:
        self._runs.pop(run_id, None)

    def _store(self, run_id: str, known: KnownMessages | None) -> None:
        self._runs[run_id] = known
        self._runs.move_to_end(run_id)
        while len(self._runs) > self._max_runs:
            self._runs.popitem(last=False)
