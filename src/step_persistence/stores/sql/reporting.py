"""The reporting views of a SQL store (`run_summary`, `tool_call_stats`), to query and to read.

Migration 0003 creates the views, 0006 today's `run_summary` (see docs/reporting.md). `run_summary` and
`tool_call_stats` (declared in `schema.py`) describe them as SQLAlchemy tables with the column types of the
store's tables, for queries of your own (`select(run_summary).where(run_summary.c.status == 'failed')`); they belong
to `VIEWS`, a metadata of their own, so the schema's `TABLES` (what the migrations and
`create_all` deal with) does not contain them. `read_report` reads every run's `RunSummary` and
every tool's `ToolStats` from the views in one transaction: the figures `step_persistence.reporting`
computes through the protocol, in two queries instead of several reads per run.

Damaged rows (values set behind the store's back) are skipped and logged like in every other read:
a view row whose instant, run id, token total or tool name cannot be read is left out. When the
database cannot compute the views at all, over a damaged value (PostgreSQL refuses to subtract an
infinite timestamp) or for a token total beyond 64 bits (every count fits, their sum need not), the
figures are computed through the protocol instead, which skips the damaged rows.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.exc import DBAPIError

from step_persistence._reading import logger, read_each
from step_persistence.reporting import RunSummary, ToolStats, summarize_runs, tool_stats
from step_persistence.stores.sql.database import is_data_exception
from step_persistence.stores.sql.executors import Transaction
from step_persistence.stores.sql.rows import fetch, readable, require_readable
from step_persistence.stores.sql.schema import VIEWS, run_summary, runs, tool_call_stats
from step_persistence.stores.sql.store import SqlStepStore

__all__ = ['VIEWS', 'read_report', 'run_summary', 'tool_call_stats']


async def read_report(store: SqlStepStore) -> tuple[list[RunSummary], list[ToolStats]]:
    """Every run's summary (in `list_runs` order) and every tool's statistics (by tool name).

    Statuses are judged by the database's clock. Like every read, this creates and migrates nothing:
    a database without the tables reports nothing, one at an older revision raises
    `SchemaNotReadyError`.
    """
    if not await store.has_schema():
        return [], []
    database = await store.ready_database()

    def read(transaction: Transaction) -> tuple[list[Any], list[Any]]:
        return fetch(transaction, _SUMMARIES), fetch(transaction, _STATS)

    try:
        summary_rows, stats_rows = await database.run(read, write=False)
    except (DBAPIError, ValueError) as error:
        # `Database.run` raises PostgreSQL's out-of-range error as a `ValueError` caused by it.
        cause = error if isinstance(error, DBAPIError) else error.__cause__
        if not (isinstance(cause, DBAPIError) and (is_data_exception(cause) or _SQLITE_OVERFLOW in str(cause.orig))):
            raise
        logger.warning('the reporting views cannot be computed over a damaged value (%r): reading run by run', error)
        return await summarize_runs(store), await tool_stats(store)
    stats = read_each(stats_rows, lambda row: f'tool statistics of {row.tool_name!r}', _tool_stats)
    summaries = read_each(summary_rows, lambda row: f'summary of run {row.run_id!r}', _run_summary)
    return summaries, sorted(stats, key=lambda row: row.tool_name)


_SQLITE_OVERFLOW = 'integer overflow'
"""What SQLite's `SUM` raises past 64 bits (PostgreSQL: a data exception, casting the total to `BIGINT`)."""

_TOTALS = ('input_tokens', 'output_tokens', 'cache_read_tokens', 'cache_write_tokens')

_SUMMARIES = (
    select(*(readable(column) for column in run_summary.columns))
    .join_from(run_summary, runs, runs.c.run_id == run_summary.c.run_id)
    .order_by(runs.c.started_at, runs.c.id)
)
_STATS = select(tool_call_stats)


def _run_summary(row: Any) -> RunSummary:
    values = row._asdict()
    require_readable(values, ('started_at', 'ended_at'))
    if not isinstance(values['run_id'], str) or not isinstance(values['started_at'], datetime):
        raise ValueError(f'malformed run id {values["run_id"]!r} or start {values["started_at"]!r}')
    for name in _TOTALS:
        if isinstance(values[name], bool) or not isinstance(values[name], int):
            raise ValueError(f'malformed {name} total {values[name]!r}')
    return RunSummary(**values)


def _tool_stats(row: Any) -> ToolStats:
    values = row._asdict()
    if not isinstance(values['tool_name'], str):
        raise ValueError(f'malformed tool name {values["tool_name"]!r}')
    return ToolStats(**values)
