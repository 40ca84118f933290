"""Which runs `runs list` shows, and their summaries, for as little work as the store allows.

The store filters the records (parent, conversation, agent), orders them and, unless a filter
applied here needs more, limits them (`candidate_runs`). A store that can summarise every run in
one query does (the SQL stores' `run_summary` view). Through the protocol alone a summary costs
three reads per run, so only the runs shown are summarised: the records come in display order,
and summarising stops once `limit` runs in the wanted status are found (plus one, to tell
whether there are more), a batch at a time.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Sequence
from datetime import datetime

from step_persistence.protocol import StepStore
from step_persistence.records import RunRecord, utc_now
from step_persistence.reporting import RunSummary, summarize_run

__all__ = ['BATCH', 'candidate_runs', 'select_summaries', 'summaries_in_one_query']

BATCH = 16
"""Runs summarised concurrently through the protocol (each summary is three reads)."""


async def candidate_runs(
    store: StepStore,
    *,
    parent_run_id: str | None = None,
    conversation_id: str | None = None,
    agent_name: str | None = None,
    since: datetime | None = None,
    newest_first: bool = True,
    wanted: int | None = None,
) -> list[RunRecord]:
    """The runs matching every filter given, in display order; at least the first `wanted` of them
    (`None`: every one).

    The store applies the filters, the order and the limit (`list_runs`); `since` is checked here,
    after it, which still lets the store limit a newest-first listing (the runs started since an
    instant are its first ones) but not an oldest-first one, which is then read whole.
    """
    limit = wanted if since is None or newest_first else None
    records = await store.list_runs(
        parent_run_id=parent_run_id,
        conversation_id=conversation_id,
        agent_name=agent_name,
        newest_first=newest_first,
        limit=limit,
    )
    return records if since is None else [record for record in records if record.started_at >= since]


async def summaries_in_one_query(store: StepStore) -> dict[str, RunSummary] | None:
    """Every run's summary by run id, where the store answers in one query; `None` where it cannot.

    The seam for a store's own path: today the SQL stores' `read_report` (the `run_summary` view,
    which also reads the tool statistics). A query that filters, orders and limits in SQL would
    replace it here without changing `runs list`.
    """
    # Only a SQL store can be a SqlStepStore, and only once its module is imported: looking it up
    # here keeps `runs list` on a file or MongoDB store from importing SQLAlchemy to find out.
    sql = sys.modules.get('step_persistence.stores.sql.store')
    if sql is None or not isinstance(store, sql.SqlStepStore):
        return None
    from step_persistence.stores.sql.reporting import read_report

    summaries, _ = await read_report(store)
    return {summary.run_id: summary for summary in summaries}


async def select_summaries(
    store: StepStore, records: Sequence[RunRecord], *, status: str | None, limit: int | None
) -> tuple[list[RunSummary], bool]:
    """The summaries of `records`, in their order, whose status is `status` (`None`: any), at most `limit`.

    Returns them and whether more runs matched than `limit`.
    """
    wanted = None if limit is None else limit + 1
    by_id = await summaries_in_one_query(store)
    selected: list[RunSummary] = []
    if by_id is not None:
        for record in records:
            summary = by_id.get(record.run_id)
            if summary is not None and (status is None or summary.status == status):
                selected.append(summary)
                if wanted is not None and len(selected) == wanted:
                    break
    else:
        now = utc_now()
        for start in range(0, len(records), BATCH):
            batch = records[start : start + BATCH]
            summaries = await asyncio.gather(*(summarize_run(store, record, now=now) for record in batch))
            selected.extend(summary for summary in summaries if status is None or summary.status == status)
            if wanted is not None and len(selected) >= wanted:
                break
    if limit is None or len(selected) <= limit:
        return selected, False
    return selected[:limit], True
