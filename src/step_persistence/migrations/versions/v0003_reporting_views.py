"""Reporting views: `run_summary` (one row per run) and `tool_call_stats` (one row per tool name).

They compute the figures of `step_persistence.reporting` (`RunSummary`, `ToolStats`) in SQL; see
docs/reporting.md. The two dialects share one definition and differ only in time arithmetic:

- durations are computed in whole microseconds and divided by 10**6 once, so every figure is the
  same double as Python's `timedelta.total_seconds()` (PostgreSQL: `EXTRACT(EPOCH ...)` is an exact
  numeric; SQLite: the store's fixed-width UTC text `YYYY-MM-DD HH:MM:SS.ffffff` split into whole
  seconds and microseconds, since `julianday()` would round);
- a run is stale when its newest event is more than 30 minutes older than the database's clock.

The views are frozen here: a later change to them is a new revision that drops and recreates them.
A later revision that rebuilds a table the views read (SQLite batch mode copies and renames it)
must drop the views first and recreate them afterwards: SQLite refuses to rename a table under a
view that names it.

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

from alembic import op

from step_persistence.migrations.naming import names
from step_persistence.stores.sql.naming import TableNames

revision = '0003'
down_revision: str | None = '0002'
branch_labels: str | None = None
depends_on: str | None = None

STALE_AFTER_MINUTES = 30
"""`step_persistence.status.DEFAULT_STALE_AFTER`, as of this revision."""


def _sqlite_microseconds(instant: str) -> str:
    """Microseconds since the epoch of a stored SQLite instant (any fraction width, or none)."""
    return (
        f"(CAST(strftime('%s', substr({instant}, 1, 19)) AS INTEGER) * 1000000"
        f" + CAST(substr(substr({instant}, 21) || '000000', 1, 6) AS INTEGER))"
    )


def _sqlite_elapsed(start: str, end: str) -> str:
    """Whole microseconds from `start` to `end` (an exact integer)."""
    return f'({_sqlite_microseconds(end)} - {_sqlite_microseconds(start)})'


def _postgres_elapsed(start: str, end: str) -> str:
    """Seconds from `start` to `end` as an exact numeric with microsecond scale."""
    return f'EXTRACT(EPOCH FROM ({end} - {start}))'


class _Dialect:
    """The time arithmetic the views need, on one dialect."""

    def __init__(self, name: str) -> None:
        self.sqlite = name == 'sqlite'

    def elapsed(self, start: str, end: str) -> str:
        """An exact elapsed time: microseconds (SQLite) or seconds (PostgreSQL)."""
        return _sqlite_elapsed(start, end) if self.sqlite else _postgres_elapsed(start, end)

    def seconds(self, elapsed: str) -> str:
        """An exact elapsed time (or an aggregate of them) as double-precision seconds."""
        return f'({elapsed}) / 1000000.0' if self.sqlite else f'CAST({elapsed} AS DOUBLE PRECISION)'

    def stale_before(self) -> str:
        """The instant before which a run's newest event makes it stale, comparable to stored instants."""
        if self.sqlite:
            return f"strftime('%Y-%m-%d %H:%M:%f', 'now', '-{STALE_AFTER_MINUTES} minutes')"
        return f"(now() - INTERVAL '{STALE_AFTER_MINUTES} minutes')"


def _run_summary(dialect: _Dialect, n: TableNames) -> str:
    return f"""
CREATE VIEW {n.table('run_summary')} AS
SELECT r.run_id,
       r.agent_name,
       r.conversation_id,
       r.parent_run_id,
       r.started_at,
       terminal.timestamp AS ended_at,
       CASE
           WHEN terminal.kind = 'run_completed' THEN 'completed'
           WHEN terminal.kind = 'run_failed' THEN 'failed'
           WHEN pending.unresolved > 0 THEN 'crashed'
           WHEN activity.last_event_at < {dialect.stale_before()} THEN 'crashed'
           ELSE 'running'
       END AS status,
       {dialect.seconds(dialect.elapsed('r.started_at', 'terminal.timestamp'))} AS duration_seconds,
       COALESCE(activity.model_requests, 0) AS model_requests,
       COALESCE(activity.tool_calls, 0) AS tool_calls,
       COALESCE(activity.tool_failures, 0) AS tool_failures,
       COALESCE(pending.unresolved, 0) AS unresolved_effects,
       COALESCE(kept.snapshots, 0) AS snapshots,
       latest.state AS latest_snapshot_state
FROM {n.table('runs')} r
LEFT JOIN (
    SELECT e.run_id,
           COUNT(CASE WHEN e.kind = 'model_request_started' THEN 1 END) AS model_requests,
           COUNT(CASE WHEN e.kind = 'tool_call_started' THEN 1 END) AS tool_calls,
           COUNT(CASE WHEN e.kind = 'tool_call_failed' THEN 1 END) AS tool_failures,
           MAX(e.timestamp) AS last_event_at,
           MAX(CASE WHEN e.kind IN ('run_completed', 'run_failed') THEN e.id END) AS terminal_id
    FROM {n.table('events')} e
    GROUP BY e.run_id
) activity ON activity.run_id = r.run_id
LEFT JOIN {n.table('events')} terminal ON terminal.id = activity.terminal_id
LEFT JOIN (
    SELECT t.run_id, COUNT(*) AS unresolved
    FROM {n.table('tool_effects')} t
    WHERE t.status = 'started'
    GROUP BY t.run_id
) pending ON pending.run_id = r.run_id
LEFT JOIN (
    SELECT s.run_id, COUNT(*) AS snapshots, MAX(s.seq) AS latest_seq
    FROM {n.table('snapshots')} s
    GROUP BY s.run_id
) kept ON kept.run_id = r.run_id
LEFT JOIN {n.table('snapshots')} latest ON latest.run_id = r.run_id AND latest.seq = kept.latest_seq
"""


def _tool_call_stats(dialect: _Dialect, n: TableNames) -> str:
    return f"""
CREATE VIEW {n.table('tool_call_stats')} AS
SELECT effects.tool_name,
       COUNT(*) AS calls,
       COUNT(CASE WHEN effects.status = 'failed' THEN 1 END) AS failures,
       COUNT(CASE WHEN effects.status = 'started' THEN 1 END) AS unresolved,
       {dialect.seconds('COALESCE(SUM(effects.settled), 0)')} AS total_seconds,
       {dialect.seconds('SUM(effects.settled)')} / NULLIF(COUNT(effects.settled), 0) AS mean_seconds,
       {dialect.seconds('MAX(effects.settled)')} AS max_seconds
FROM (
    SELECT t.tool_name,
           t.status,
           CASE WHEN t.status <> 'started' AND t.ended_at IS NOT NULL
                THEN {dialect.elapsed('t.started_at', 't.ended_at')}
           END AS settled
    FROM {n.table('tool_effects')} t
) effects
GROUP BY effects.tool_name
"""


def upgrade() -> None:
    dialect = _Dialect(op.get_context().dialect.name)
    op.execute(_run_summary(dialect, names()))
    op.execute(_tool_call_stats(dialect, names()))


def downgrade() -> None:
    n = names()
    # IF EXISTS: a database stamped at 0003 without running it has no views to drop.
    op.execute(f'DROP VIEW IF EXISTS {n.table("tool_call_stats")}')
    op.execute(f'DROP VIEW IF EXISTS {n.table("run_summary")}')
