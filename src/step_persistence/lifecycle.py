"""The run lifecycle operations every store shares: collecting delegated runs, pruning old runs.

Stores call these from their `delete_run(cascade=True)` and `prune_runs`, with their own native
pieces where they have better ones (the SQL store deletes a whole delegation tree in one
transaction, and finds prune candidates with an indexed query). The status rule itself lives in
`step_persistence.status.run_status`; nothing here restates it.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from datetime import datetime

from step_persistence._delegation import DelegationWalk
from step_persistence.protocol import StepStore
from step_persistence.records import RUN_STATUSES, RunRecord, RunStatus, require_utc, utc_now
from step_persistence.status import run_status

__all__ = ['delegated_run_ids', 'delete_delegated_runs', 'prunable_runs', 'prune_runs', 'validate_statuses']


async def delegated_run_ids(
    store: StepStore, run_id: str, *, every_run: Iterable[RunRecord] | None = None
) -> list[str]:
    """Every run delegated from `run_id`, transitively, breadth first (children, then grandchildren...).

    Runs are found through `list_runs(parent_run_id=...)`, or in `every_run` when the caller
    already has all of them (one listing instead of one per run of the tree), also when `run_id`
    itself is no longer stored. `run_id` is never in the result, and a `parent_run_id` cycle ends
    the walk instead of looping. Reversed, the list names every run after all the runs delegated
    from it.
    """
    children: dict[str, list[str]] | None = None
    if every_run is not None:
        children = {}
        for record in every_run:
            if record.parent_run_id is not None:
                children.setdefault(record.parent_run_id, []).append(record.run_id)
    walk = DelegationWalk(run_id)
    while walk.level:
        if children is not None:
            walk.add_children(child for parent in walk.level for child in children.get(parent, []))
        else:
            listed = [await store.list_runs(parent_run_id=parent) for parent in walk.level]
            walk.add_children(record.run_id for records in listed for record in records)
    return walk.found


async def delete_delegated_runs(
    store: StepStore, run_id: str, *, every_run: Iterable[RunRecord] | None = None
) -> list[str]:
    """Delete every run delegated from `run_id`, transitively, deepest first; return their ids in deletion order.

    Each run is deleted only after every run delegated from it, so a crash in the middle leaves
    a smaller tree still reachable from `run_id`, and calling this again finishes the job.
    The run `run_id` itself is left to the caller. `every_run`: as for `delegated_run_ids`.
    """
    doomed = list(reversed(await delegated_run_ids(store, run_id, every_run=every_run)))
    for descendant in doomed:
        await store.delete_run(run_id=descendant)
    return doomed


def validate_statuses(statuses: Collection[RunStatus] | None) -> frozenset[str] | None:
    """`statuses` as a set, or `None`; `ValueError` for a string or a status that does not exist."""
    if statuses is None:
        return None
    if isinstance(statuses, str):
        raise ValueError(f'statuses must be a collection of run statuses, not the string {statuses!r}')
    wanted = frozenset(statuses)
    unknown = sorted(str(status) for status in wanted - RUN_STATUSES)
    if unknown:
        raise ValueError(f'unknown run status {", ".join(unknown)}: expected some of {", ".join(sorted(RUN_STATUSES))}')
    return wanted


async def prunable_runs(
    store: StepStore,
    *,
    older_than: datetime,
    statuses: Collection[RunStatus] | None = None,
    include_running: bool = False,
    candidates: Iterable[RunRecord] | None = None,
) -> list[str]:
    """The runs `StepStore.prune_runs` would delete, oldest first; nothing is deleted.

    `candidates`: the runs that started before `older_than`, oldest first, if the store can find
    them better than by filtering `list_runs()`; their `started_at` is checked again here. Every
    status is computed against one `now`, taken before the first run is judged.
    """
    cutoff = require_utc(older_than)
    wanted = validate_statuses(statuses)
    if candidates is None:
        candidates = await store.list_runs()
    now = utc_now()
    chosen: list[str] = []
    for record in candidates:
        if record.started_at >= cutoff:
            continue
        if wanted is not None or not include_running:
            status = run_status(
                await store.list_events(run_id=record.run_id),
                await store.list_unresolved_tool_effects(run_id=record.run_id),
                now=now,
            )
            if (status == 'running' and not include_running) or (wanted is not None and status not in wanted):
                continue
        chosen.append(record.run_id)
    return chosen


async def prune_runs(
    store: StepStore,
    *,
    older_than: datetime,
    statuses: Collection[RunStatus] | None = None,
    include_running: bool = False,
    candidates: Iterable[RunRecord] | None = None,
) -> list[str]:
    """`StepStore.prune_runs` on any store: the `prunable_runs`, each deleted through `store.delete_run`."""
    doomed = await prunable_runs(
        store, older_than=older_than, statuses=statuses, include_running=include_running, candidates=candidates
    )
    for run_id in doomed:
        await store.delete_run(run_id=run_id)
    return doomed
