"""Run ids a store has seen registered, so that checking a run exists costs one lookup per run."""

from __future__ import annotations

from collections import OrderedDict

__all__ = ['KnownRuns']


class KnownRuns:
    """A bounded, least-recently-used set of run ids known to be registered."""

    def __init__(self, max_runs: int = 4096) -> None:
        self._runs: OrderedDict[str, None] = OrderedDict()
        self._max_runs = max_runs

    def knows(self, run_id: str) -> bool:
        if run_id not in self._runs:
            return False
        self._runs.move_to_end(run_id)
        return True

    def add(self, run_id: str) -> None:
        self._runs[run_id] = None
        self._runs.move_to_end(run_id)
        while len(self._runs) > self._max_runs:
            self._runs.popitem(last=False)

    def discard(self, run_id: str) -> None:
        self._runs.pop(run_id, None)
