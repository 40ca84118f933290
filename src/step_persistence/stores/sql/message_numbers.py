"""The per-run message numbers a store knows to be committed, so a save inserts only new messages."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ['KnownMessages', 'MessageNumbers']


@dataclass
class KnownMessages:
    """Digest -> message number for one run, valid while the run keeps the surrogate key `run_pk`.

    A run deleted and registered again (perhaps by another process) gets a new `run_pk` and
    numbers its messages afresh, so numbers remembered under the old key must not be used.
    """

    run_pk: int
    numbers: dict[str, int]


class MessageNumbers:
    """A bounded, least-recently-used map of run id -> `KnownMessages`, filled lazily from writes."""

    def __init__(self, max_runs: int = 256) -> None:
        self._runs: OrderedDict[str, KnownMessages] = OrderedDict()
        self._max_runs = max_runs

    def get(self, run_id: str) -> KnownMessages | None:
        known = self._runs.get(run_id)
        if known is not None:
            self._runs.move_to_end(run_id)
        return known

    def remember(self, run_id: str, run_pk: int, numbers: Mapping[str, int]) -> None:
        """Add committed numbers (call after the transaction that wrote or read them commits)."""
        known = self._runs.get(run_id)
        if known is None or known.run_pk != run_pk:
            self._runs[run_id] = KnownMessages(run_pk=run_pk, numbers=dict(numbers))
        else:
            known.numbers.update(numbers)
        self._runs.move_to_end(run_id)
        while len(self._runs) > self._max_runs:
            self._runs.popitem(last=False)

    def forget(self, run_id: str) -> None:
        self._runs.pop(run_id, None)
