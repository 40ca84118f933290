"""The SQL schema, declared once for SQLite and PostgreSQL (see docs/sql.md for a table reference).

Every constraint and index has a stable name (`MetaData(naming_convention=...)`), so migrations
refer to them identically on both dialects. The migrations in `step_persistence.migrations`
create exactly this schema; a test checks that they agree.

The tables are SQLAlchemy Core `Table`s in `TABLES` (the store runs Core statements only), so
opening a store does not import the ORM. A column's `doc` says what it holds; it is not written
to the database.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
    event,
    text,
)
from sqlalchemy.engine import Connection
from sqlalchemy.sql.elements import TextClause

from step_persistence.stores.sql.types import JSON_DOCUMENT, DateTimeUTC, EncodedJSON

__all__ = [
    'NAMING_CONVENTION',
    'PARTIAL_INDEX_PREDICATE',
    'TABLES',
    'TABLE_NAMES',
    'VERSION_TABLE',
    'VIEWS',
    'conversations',
    'durable_units',
    'durable_workflows',
    'events',
    'history_lines',
    'media',
    'messages',
    'run_summary',
    'runs',
    'snapshot_keys',
    'snapshots',
    'tool_call_stats',
    'tool_effects',
    'with_postgresql_predicates',
]

NAMING_CONVENTION: dict[str, str] = {
    'ix': 'ix_%(table_name)s_%(column_0_N_name)s',
    'uq': 'uq_%(table_name)s_%(column_0_N_name)s',
    'ck': 'ck_%(table_name)s_%(constraint_name)s',
    'fk': 'fk_%(table_name)s_%(column_0_N_name)s_%(referred_table_name)s',
    'pk': 'pk_%(table_name)s',
}

VERSION_TABLE = 'step_persistence_alembic_version'
"""Alembic's version table for this library's migrations, distinct from an application's own."""

SERIAL = BigInteger().with_variant(Integer(), 'sqlite')
"""An auto-incrementing key: `BIGSERIAL` on PostgreSQL, SQLite's `INTEGER PRIMARY KEY` rowid."""

IDEMPOTENCY_KEY_SET = text('idempotency_key IS NOT NULL')
CONTINUED = text("origin_kind = 'continued'")

TABLES = MetaData(naming_convention=NAMING_CONVENTION)
"""The step-persistence tables (what the migrations create, and what they are compared with)."""


PARTIAL_INDEX_PREDICATE = 'step_persistence_where'
"""The key of a partial index's `info` holding its predicate (`_unique_where`, `with_postgresql_predicates`)."""


def _unique_where(name: str, *columns: str, where: TextClause) -> Index:
    """A unique index over the rows for which `where` holds (a partial index, on both dialects).

    The predicate is declared for SQLite here (`sqlite_where`) and for PostgreSQL by
    `with_postgresql_predicates`, which DDL and schema comparisons use (`TableNames.metadata()`, and
    `_before_create` for `create_all` or `create` on PostgreSQL): SQLAlchemy checks an option such as
    `postgresql_where` by importing its dialect, about 20 ms in every process, SQLite-only ones included.
    """
    return Index(name, *columns, unique=True, sqlite_where=where, info={PARTIAL_INDEX_PREDICATE: where})


def _before_create(table: Table, connection: Connection, **_: Any) -> None:
    """Before `table` is created (`TABLES.create_all`, `table.create`) on PostgreSQL: its partial indexes'
    predicates declared there too."""
    if connection.dialect.name == 'postgresql':
        with_postgresql_predicates(TABLES)


def with_postgresql_predicates(metadata: MetaData) -> MetaData:
    """`metadata` (`TABLES`, or a copy of it, `naming.py`) with the predicate of each partial index declared
    for PostgreSQL too (`postgresql_where`), as DDL and schema comparisons on PostgreSQL need it; returns
    `metadata`. Imports SQLAlchemy's PostgreSQL dialect; calling it again changes nothing."""
    for table in metadata.tables.values():
        for index in table.indexes:
            predicate = index.info.get(PARTIAL_INDEX_PREDICATE)
            if predicate is not None:
                index.dialect_kwargs['postgresql_where'] = predicate
    return metadata


def _run_fk() -> Column[str]:
    return Column('run_id', String, ForeignKey('runs.run_id', ondelete='CASCADE'), primary_key=True)


runs = Table(
    'runs',
    TABLES,
    Column(
        'id',
        SERIAL,
        primary_key=True,
        autoincrement=True,
        doc='Registration order (breaks `started_at` ties); never reused, also on SQLite (`AUTOINCREMENT`), '
        'so it tells a run apart from an earlier, deleted run with the same `run_id`.',
    ),
    Column('run_id', String, nullable=False, unique=True),
    Column('conversation_id', String),
    Column('parent_run_id', String),
    Column('agent_name', String),
    Column('metadata', JSON_DOCUMENT, nullable=False),
    Column('started_at', DateTimeUTC, nullable=False),
    Column(
        'origin_kind',
        String,
        doc='`RunRecord.origin.kind` (`continued` or `forked`); `NULL` (with the other two): no origin. At most '
        'one run is stored as the continuation of one snapshot (`uq_runs_origin_run_id_origin_seq`).',
    ),
    Column('origin_run_id', String),
    Column('origin_seq', BigInteger),
    Column(
        'last_snapshot_seq',
        BigInteger,
        nullable=False,
        server_default=text('0'),
        doc='The highest snapshot sequence number handed out for this run.',
    ),
    Column(
        'bare',
        Boolean,
        nullable=False,
        server_default=text('false'),
        doc='Registered by a write (`stores/_bare.py`), not yet by `register_run`, whose one call fills the row in '
        '(revision 0007; runs stored before it were all registered).',
    ),
    Index('ix_runs_started_at_id', 'started_at', 'id'),
    Index('ix_runs_conversation_id_started_at_id', 'conversation_id', 'started_at', 'id'),
    Index('ix_runs_parent_run_id_started_at_id', 'parent_run_id', 'started_at', 'id'),
    Index('ix_runs_agent_name_started_at_id', 'agent_name', 'started_at', 'id'),
    Index('ix_runs_agent_name_conversation_id_started_at_id', 'agent_name', 'conversation_id', 'started_at', 'id'),
    Index('ix_runs_origin_run_id_started_at_id', 'origin_run_id', 'started_at', 'id'),
    _unique_where('uq_runs_origin_run_id_origin_seq', 'origin_run_id', 'origin_seq', where=CONTINUED),
    sqlite_autoincrement=True,
)
"""One agent run (`RunRecord`), plus the counter that numbers its snapshots."""

conversations = Table(
    'conversations',
    TABLES,
    Column('conversation_id', String, primary_key=True),
    Column('first_started_at', DateTimeUTC, nullable=False),
    Column('last_started_at', DateTimeUTC, nullable=False, doc="The newest run's `started_at`."),
    Column('run_count', BigInteger, nullable=False),
    Column(
        'head_run_pk',
        BigInteger,
        nullable=False,
        doc='`runs.id` of the newest run (ties of `started_at` go to the later registration).',
    ),
    Column('head_run_id', String, nullable=False),
    Index('ix_conversations_last_started_at_conversation_id', 'last_started_at', 'conversation_id'),
)
"""One row per `conversation_id` among the runs: what `list_conversations` returns, kept up to date by
the transactions that register and delete runs."""

history_lines = Table(
    'history_lines',
    TABLES,
    Column('id', SERIAL, primary_key=True, autoincrement=True, doc='Never reused (`AUTOINCREMENT` on SQLite).'),
    Column(
        'last_message_no',
        BigInteger,
        nullable=False,
        server_default=text('0'),
        doc="`no` of the line's newest `messages` row (0 before the first): a save appends to the line only "
        'while this is still the `through` of the view it builds on.',
    ),
    Column('base_line_id', BigInteger),
    Column('base_length', Integer),
    Column('base_through', BigInteger),
    Index('ix_history_lines_base_line_id_base_through', 'base_line_id', 'base_through'),
    sqlite_autoincrement=True,
)
"""A history line: the numbering of message rows that a chat's runs share (see `stores/_positions.py`).

A line with a base (a branch) starts from the view `(base_line_id, base_length, base_through)`:
its positions below `base_length` without a row of their own resolve there.
"""

events = Table(
    'events',
    TABLES,
    Column('id', SERIAL, primary_key=True, autoincrement=True),
    Column('run_id', String, ForeignKey('runs.run_id', ondelete='CASCADE'), nullable=False),
    Column('kind', String, nullable=False),
    Column('step_index', Integer, nullable=False),
    Column('timestamp', DateTimeUTC, nullable=False),
    Column('conversation_id', String),
    Column('parent_run_id', String),
    Column('agent_name', String),
    Column('tool_call_id', String),
    Column('tool_name', String),
    Column('error', Text),
    Column('metadata', JSON_DOCUMENT, nullable=False),
    Column('idempotency_key', String),
    Column('model_name', String),
    Column(
        'input_tokens',
        BigInteger,
        doc='`StepEvent.usage`, in four columns: all four `NULL` (an event without usage, or written before '
        'revision 0006) or none.',
    ),
    Column('output_tokens', BigInteger),
    Column('cache_read_tokens', BigInteger),
    Column('cache_write_tokens', BigInteger),
    Index('ix_events_run_id_id', 'run_id', 'id'),
    _unique_where('uq_events_run_id_idempotency_key', 'run_id', 'idempotency_key', where=IDEMPOTENCY_KEY_SET),
)
"""The append-only event log (`StepEvent`); append order is `id` order."""

messages = Table(
    'messages',
    TABLES,
    Column('line_id', BigInteger, primary_key=True, autoincrement=False, doc='`history_lines.id`.'),
    Column('no', BigInteger, primary_key=True, autoincrement=False),
    Column('position', Integer, nullable=False, doc="The message's index in the history (0 is the first message)."),
    Column(
        'digest',
        String(64),
        nullable=False,
        doc="SHA-256 (hex) of the message's JSON encoding (before any payload moved to the media store).",
    ),
    Column(
        'body',
        EncodedJSON,
        nullable=False,
        doc="The message as pydantic-ai's JSON (`ModelMessagesTypeAdapter` format, one message).",
    ),
    Column(
        'externalized',
        Boolean,
        nullable=False,
        doc='Whether `body` holds media markers: large payloads live in the media store, put back on read.',
    ),
    Index('ix_messages_line_id_position_no', 'line_id', 'position', 'no'),
)
"""Every version of every message position of a history line, each stored once.

Row `no` (numbered per line, in the order rows are written) holds a version of the message at
`position` of the histories of the line. A save writes rows only for the positions whose
message differs from the view it builds on; a snapshot names its messages with its line,
`history_length` and `through_message` (see `snapshots`).
"""

snapshots = Table(
    'snapshots',
    TABLES,
    _run_fk(),
    Column('seq', BigInteger, primary_key=True, autoincrement=False),
    Column('step_index', Integer, nullable=False),
    Column('timestamp', DateTimeUTC, nullable=False),
    Column('conversation_id', String),
    Column('parent_run_id', String),
    Column('agent_name', String),
    Column('idempotency_key', String),
    Column(
        'line_id',
        BigInteger,
        doc="The history line of the snapshot's view (`NULL`: an empty history, which needs none).",
    ),
    Column('history_length', Integer, nullable=False, doc="How many messages the snapshot's history has."),
    Column(
        'through_message', BigInteger, nullable=False, doc='The newest `messages.no` of the line the history may use.'
    ),
    Column(
        'history_digest',
        String(64),
        doc='`ContinuableSnapshot.history_digest()` of the history (`NULL` for snapshots saved before revision 0005).',
    ),
    Column('state', String, nullable=False, server_default='complete'),
    Index('ix_snapshots_run_id_state_seq', 'run_id', 'state', 'seq'),
    Index('ix_snapshots_line_id_through_message', 'line_id', 'through_message'),
    Index('ix_snapshots_conversation_id_history_digest', 'conversation_id', 'history_digest'),
)
"""A continuable snapshot: its fields, and its view of a history line.

Message `i` of the history (`0 <= i < history_length`) is the row of line `line_id` at
position `i` with the highest `no` that is at most `through_message`, or, without one, message
`i` of the line's base view. Three integers, whatever the length of the history.
"""

snapshot_keys = Table(
    'snapshot_keys',
    TABLES,
    _run_fk(),
    Column('idempotency_key', String, primary_key=True),
)
"""Every snapshot idempotency key a run has used; outlives the pruning of its snapshot."""

tool_effects = Table(
    'tool_effects',
    TABLES,
    _run_fk(),
    Column('tool_call_id', String, primary_key=True),
    Column('tool_name', String, nullable=False),
    Column('status', String, nullable=False),
    Column('started_at', DateTimeUTC, nullable=False),
    Column('ended_at', DateTimeUTC),
    Column('idempotency_key', String),
    Column('effect_summary', Text),
    Index('ix_tool_effects_run_id_status_started_at', 'run_id', 'status', 'started_at'),
)
"""The tool-effect ledger (`ToolEffectRecord`), one row per `(run_id, tool_call_id)`."""

media = Table(
    'media',
    TABLES,
    Column(
        'digest',
        String(64),
        primary_key=True,
        doc="SHA-256 (hex) of `data`: the blob's media URI is `media+sha256://<digest>`.",
    ),
    Column('data', LargeBinary, nullable=False),
    Column('media_type', String),
    Column('filename', String),
    Column('metadata', JSON_DOCUMENT, nullable=False),
    Column('created_at', DateTimeUTC, nullable=False),
    Column(
        'touched_at',
        DateTimeUTC,
        doc='When the blob was last put again or reused (`NULL`: never since `created_at`); `collect_media` '
        'deletes an unreferenced blob only when this (or `created_at`) is older than its grace.',
    ),
)
"""Content-addressed blobs (the SQL media store); shared by runs, never deleted with one."""

durable_workflows = Table(
    'durable_workflows',
    TABLES,
    Column('workflow_id', String, primary_key=True),
    Column('agent_name', String),
    Column('run_id', String, doc="pydantic-ai's `run_id` of the run (the workflow id for a top-level run)."),
    Column('status', String, nullable=False, doc='`running`, `completed` or `failed`.'),
    Column('code_version', String),
    Column('inputs', JSON_DOCUMENT, nullable=False),
    Column('attempts', Integer, nullable=False),
    Column('owner', String, doc='The process holding the lease (recovery of abandoned runs).'),
    Column('lease_expires_at', DateTimeUTC),
    Column('fencing_epoch', BigInteger, nullable=False),
    Column('created_at', DateTimeUTC, nullable=False),
    Column('updated_at', DateTimeUTC, nullable=False),
)
"""Durable workflows (`WorkflowRecord`, docs/durable.md): one row per workflow id."""

durable_units = Table(
    'durable_units',
    TABLES,
    Column(
        'workflow_id',
        String,
        ForeignKey('durable_workflows.workflow_id', ondelete='CASCADE'),
        primary_key=True,
    ),
    Column('unit_key', String, primary_key=True),
    Column('name', String, nullable=False),
    Column('kind', String, nullable=False),
    Column('status', String, nullable=False, doc='`started`, `completed` (final) or `failed`.'),
    Column('tool_call_id', String, doc='The tool call a `tool` unit ran.'),
    Column('fingerprint', String),
    Column(
        'result',
        JSON_DOCUMENT,
        doc="`{'value': payload}`: the encoded result of a completed unit; with `'externalized': true` when "
        'the payload holds media markers (its media is in the media store).',
    ),
    Column('error', Text),
    Column('attempts', Integer, nullable=False),
    Column('started_at', DateTimeUTC, nullable=False),
    Column('ended_at', DateTimeUTC),
)
"""The units of each durable workflow (`DurableUnit`), one row per `(workflow_id, unit_key)`."""

VIEWS = MetaData()
"""The reporting views, described as tables (never created from here: migrations 0003 and 0006 do), in a metadata of
their own so that `TABLES` (what the migrations are compared with) holds the tables only."""

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
    Column('input_tokens', BigInteger()),
    Column('output_tokens', BigInteger()),
    Column('cache_read_tokens', BigInteger()),
    Column('cache_write_tokens', BigInteger()),
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


for _table in TABLES.tables.values():
    if any(PARTIAL_INDEX_PREDICATE in index.info for index in _table.indexes):
        event.listen(_table, 'before_create', _before_create)

TABLE_NAMES: frozenset[str] = frozenset(TABLES.tables)
"""The tables this library owns (besides `VERSION_TABLE`)."""
