"""The SQL store's run lifecycle: listing a run's tool effects, deleting delegation trees, prune candidates.

Every query here is served by an index of `schema.py`: tool effects by their primary key
`(run_id, tool_call_id)`, delegated runs by `ix_runs_parent_run_id_started_at_id`, prune
candidates by `ix_runs_started_at_id`. Deleting a run with its delegated runs happens in one
transaction, so a crash leaves either the whole tree or none of it.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import select

from step_persistence._delegation import DelegationWalk
from step_persistence.stores.sql import rows
from step_persistence.stores.sql.executors import Transaction
from step_persistence.stores.sql.schema import runs, tool_effects
from step_persistence.stores.sql.writes import Writes

__all__ = ['delete_runs', 'runs_started_before', 'tool_effects_of_run']

_CHUNK = 500
"""How many run ids one `IN (...)` list holds (far below SQLite's and asyncpg's parameter limits)."""


def tool_effects_of_run(run_id: str) -> Any:
    """Every tool effect row of the run, oldest `started_at` first, ties by `tool_call_id`."""
    return (
        select(*rows.TOOL_EFFECT_COLUMNS)
        .where(tool_effects.c.run_id == run_id)
        .order_by(tool_effects.c.started_at, tool_effects.c.tool_call_id)
    )


def runs_started_before(cutoff: datetime) -> Any:
    """Every run row that started strictly before `cutoff`, oldest first (ties in registration order)."""
    return select(*rows.RUN_COLUMNS).where(runs.c.started_at < cutoff).order_by(runs.c.started_at, runs.c.id)


def _chunks(items: Sequence[str]) -> Iterator[Sequence[str]]:
    for start in range(0, len(items), _CHUNK):
        yield items[start : start + _CHUNK]


def _delegated(transaction: Transaction, run_id: str) -> list[str]:
    """The runs delegated from `run_id`, transitively, breadth first (see `DelegationWalk`)."""
    walk = DelegationWalk(run_id)
    while walk.level:
        children = [
            child
            for parents in _chunks(walk.level)
            for (child,) in transaction.execute(select(runs.c.run_id).where(runs.c.parent_run_id.in_(parents)))
        ]
        walk.add_children(children)
    return walk.found


def delete_runs(transaction: Transaction, *, writes: Writes, run_id: str, cascade: bool) -> list[str]:
    """Delete the run (with `cascade`, and every run delegated from it) in this transaction.

    Returns the deleted run ids, each run after the runs delegated from it and `run_id` last
    (ids of runs that were not stored included: deleting them is a no-op).
    """
    doomed = [*reversed(_delegated(transaction, run_id)), run_id] if cascade else [run_id]
    for doomed_id in doomed:
        writes.delete_run(transaction, doomed_id)
    return doomed
