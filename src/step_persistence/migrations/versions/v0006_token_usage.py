"""Token usage on the event log, and each run's totals in `run_summary`.

- `events` gets `model_name`, `input_tokens`, `output_tokens`, `cache_read_tokens` and
  `cache_write_tokens` (`StepEvent.model_name` and `usage`), added in place on both dialects (no
  table copy under the views); every event written before has them `NULL`.
- `run_summary` is dropped and created again: 0003's columns, then `input_tokens`,
  `output_tokens`, `cache_read_tokens` and `cache_write_tokens`, each the sum over the run's
  events (0 when none has usage), computed in the same pass over `events` as 0003's counts.
  `tool_call_stats` stays as 0003 made it.

Both directions drop the view before changing `events` (neither dialect drops a column a view
names); the downgrade then drops the columns and creates 0003's `run_summary` again from 0003's
own definition.

Revision ID: 0006
Revises: 0005
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from step_persistence.migrations.naming import names
from step_persistence.migrations.versions import v0003_reporting_views as v0003
from step_persistence.stores.sql.naming import TableNames

revision = '0006'
down_revision: str | None = '0005'
branch_labels: str | None = None
depends_on: str | None = None

USAGE_COLUMNS = ('input_tokens', 'output_tokens', 'cache_read_tokens', 'cache_write_tokens')
"""The `events` columns of `StepEvent.usage`, and the totals `run_summary` gains, by the same names."""


def _run_summary(dialect: v0003._Dialect, n: TableNames) -> str:
    """0003's `run_summary` with the token totals after its columns (the view is frozen here)."""
    sums = ''.join(f',\n           SUM(e.{name}) AS {name}' for name in USAGE_COLUMNS)
    totals = ''.join(f',\n       CAST(COALESCE(activity.{name}, 0) AS BIGINT) AS {name}' for name in USAGE_COLUMNS)
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
       latest.state AS latest_snapshot_state{totals}
FROM {n.table('runs')} r
LEFT JOIN (
    SELECT e.run_id,
           COUNT(CASE WHEN e.kind = 'model_request_started' THEN 1 END) AS model_requests,
           COUNT(CASE WHEN e.kind = 'tool_call_started' THEN 1 END) AS tool_calls,
           COUNT(CASE WHEN e.kind = 'tool_call_failed' THEN 1 END) AS tool_failures,
           MAX(e.timestamp) AS last_event_at,
           MAX(CASE WHEN e.kind IN ('run_completed', 'run_failed') THEN e.id END) AS terminal_id{sums}
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


def upgrade() -> None:
    n = names()
    events = n.table('events')
    op.execute(f'DROP VIEW {n.table("run_summary")}')
    op.add_column(events, sa.Column('model_name', sa.String(), nullable=True))
    for name in USAGE_COLUMNS:
        op.add_column(events, sa.Column(name, sa.BigInteger(), nullable=True))
    op.execute(_run_summary(v0003._Dialect(op.get_context().dialect.name), n))


def downgrade() -> None:
    n = names()
    op.execute(f'DROP VIEW {n.table("run_summary")}')
    # Plain ALTER TABLE ... DROP COLUMN (SQLite 3.35+): batch mode would copy the table.
    for name in reversed(USAGE_COLUMNS):
        op.drop_column(n.table('events'), name)
    op.drop_column(n.table('events'), 'model_name')
    op.execute(v0003._run_summary(v0003._Dialect(op.get_context().dialect.name), n))
