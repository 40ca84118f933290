"""The reporting views of a SQL store (`run_summary`, `tool_call_stats`), to query and to read.

Migration 0003 creates the views (see docs/reporting.md). `run_summary` and `tool_call_stats`
here describe them as SQLAlchemy tables with the column types of the store's tables, for
queries of your own (`select(run_summary).where(run_summary.c.status == 'failed')`); they belong
to `VIEWS`, a metadata of their own, so the schema's `Base.metadata` (what the migrations and
`create_all` deal with) does not contain them. `read_report` reads every run's `RunSummary` and
every tool's `ToolStats` from the views in one transaction: the figures `step_persistence.reporting`
computes through the protocol, in two queries instead of several reads per run.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Column, Float, Integer, MetaData, String, Table, select

from step_persistence.reporting import RunSummary, ToolStats
from step_persistence.stores.sql.executors import Transaction
from step_persistence.stores.sql.schema import runs
from step_persistence.stores.sql.store import SqlStepStore
from step_persistence.stores.sql.types import DateTimeUTC

__all__ = ['VIEWS', 'read_report', 'run_summary', 'tool_call_stats']

VIEWS = MetaData()
"""The reporting views, described as tables (never created from here: migration 0003 does)."""

run_summary = Table(
    'run_summary',
    VIEWS,
    Column('run_id', String()),
    Column('agent_name', String()),
    Column('conversation_id', String()),
    Column('parent_run_id', String()),
    Column('started_at', DateTimeUTC()),
    Column('ended_at', DateTimeUTC()),
    Column('status', String()),
    Column('duration_seconds', Float()),
    Column('model_requests', Integer()),
    Column('tool_calls', Integer()),
    Column('tool_failures', Integer()),
    Column('unresolved_effects', Integer()),
    Column('snapshots', Integer()),
    Column('latest_snapshot_state', String()),
)
"""The `run_summary` view: one row per run, the fields of `RunSummary`."""

tool_call_stats = Table(
    'tool_call_stats',
    VIEWS,
    Column('tool_name', String()),
    Column('calls', Integer()),
    Column('failures', Integer()),
    Column('unresolved', Integer()),
    Column('total_seconds', Float()),
    Column('mean_seconds', Float()),
    Column('max_seconds', Float()),
)
"""The `tool_call_stats` view: one row per tool name in the ledger, the fields of `ToolStats`."""


async def read_report(store: SqlStepStore) -> tuple[list[RunSummary], list[ToolStats]]:
    """Every run's summary (in `list_runs` order) and every tool's statistics (by tool name).

    Statuses are judged by the database's clock. Like every read of the store, this creates or
    upgrades the schema first when the store migrates automatically.
    """
    database = await store.ready_database()
    summaries = (
        select(run_summary).join(runs, runs.c.run_id == run_summary.c.run_id).order_by(runs.c.started_at, runs.c.id)
    )

    def read(transaction: Transaction) -> tuple[list[Any], list[Any]]:
        return list(transaction.execute(summaries)), list(transaction.execute(select(tool_call_stats)))

    summary_rows, stats_rows = await database.run(read, write=False)
    stats = sorted((ToolStats(**row._asdict()) for row in stats_rows), key=lambda row: row.tool_name)
    return [RunSummary(**row._asdict()) for row in summary_rows], stats
