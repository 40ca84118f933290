"""Walking a delegation tree (runs linked by `parent_run_id`), written once for every store."""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ['DelegationWalk']


class DelegationWalk:
    """The runs delegated from one run, transitively, breadth first; a `parent_run_id` cycle ends the walk.

    Drive it level by level with whatever reads children (a query, a listing, a dict):

        walk = DelegationWalk(run_id)
        while walk.level:
            walk.add_children(children_of(walk.level))
        walk.found  # every delegated run id, nearest first
    """

    def __init__(self, run_id: str) -> None:
        self._seen = {run_id}
        self.found: list[str] = []
        """Every delegated run id found so far, level by level."""
        self.level: list[str] = [run_id]
        """The runs whose children are to be read next (empty once the walk is over)."""

    def add_children(self, children: Iterable[str]) -> None:
        """Record the children of every run in `level`; those not seen before become the next level."""
        next_level: list[str] = []
        for child in children:
            if child not in self._seen:
                self._seen.add(child)
                next_level.append(child)
        self.found.extend(next_level)
        self.level = next_level
