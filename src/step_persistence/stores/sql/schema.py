"""The SQL schema, declared once for SQLite and PostgreSQL (see docs/sql.md for a table reference).

Every constraint and index has a stable name (`MetaData(naming_convention=...)`), so migrations
refer to them identically on both dialects. The migrations in `step_persistence.migrations`
create exactly this schema; a test checks that they agree.
"""

from __future__ import annotations

from datetime import datetime
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
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from step_persistence.stores.sql.types import JSON_DOCUMENT, DateTimeUTC, EncodedJSON

__all__ = [
    'NAMING_CONVENTION',
    'TABLE_NAMES',
    'VERSION_TABLE',
    'VIEWS',
    'Base',
    'Conversation',
    'Event',
    'HistoryLine',
    'Media',
    'Message',
    'Run',
    'Snapshot',
    'SnapshotKey',
    'ToolEffect',
    'conversations',
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


class Base(DeclarativeBase):
    """Declarative base of the step-persistence tables."""

    metadata = MetaData(naming_convention=NAMING_CONVENTION)


def _run_fk() -> Mapped[str]:
    return mapped_column(String, ForeignKey('runs.run_id', ondelete='CASCADE'), primary_key=True)


class Run(Base):
    """One agent run (`RunRecord`), plus the counter that numbers its snapshots."""

    __tablename__ = 'runs'
    __table_args__ = (
        Index('ix_runs_started_at_id', 'started_at', 'id'),
        Index('ix_runs_conversation_id_started_at_id', 'conversation_id', 'started_at', 'id'),
        Index('ix_runs_parent_run_id_started_at_id', 'parent_run_id', 'started_at', 'id'),
        Index('ix_runs_agent_name_started_at_id', 'agent_name', 'started_at', 'id'),
        Index('ix_runs_agent_name_conversation_id_started_at_id', 'agent_name', 'conversation_id', 'started_at', 'id'),
        Index('ix_runs_origin_run_id_started_at_id', 'origin_run_id', 'started_at', 'id'),
        Index(
            'uq_runs_origin_run_id_origin_seq',
            'origin_run_id',
            'origin_seq',
            unique=True,
            sqlite_where=CONTINUED,
            postgresql_where=CONTINUED,
        ),
        {'sqlite_autoincrement': True},
    )

    id: Mapped[int] = mapped_column(SERIAL, primary_key=True, autoincrement=True)
    """Registration order (breaks `started_at` ties); never reused, also on SQLite (`AUTOINCREMENT`),
    so it tells a run apart from an earlier, deleted run with the same `run_id`."""
    run_id: Mapped[str] = mapped_column(String, unique=True)
    conversation_id: Mapped[str | None] = mapped_column(String)
    parent_run_id: Mapped[str | None] = mapped_column(String)
    agent_name: Mapped[str | None] = mapped_column(String)
    metadata_: Mapped[dict[str, str]] = mapped_column('metadata', JSON_DOCUMENT)
    started_at: Mapped[datetime] = mapped_column(DateTimeUTC)
    origin_kind: Mapped[str | None] = mapped_column(String)
    """`RunRecord.origin.kind` (`continued` or `forked`); `NULL` (with the other two): no origin. At most one
    run is stored as the continuation of one snapshot (`uq_runs_origin_run_id_origin_seq`)."""
    origin_run_id: Mapped[str | None] = mapped_column(String)
    origin_seq: Mapped[int | None] = mapped_column(BigInteger)
    last_snapshot_seq: Mapped[int] = mapped_column(BigInteger, server_default=text('0'))
    """The highest snapshot sequence number handed out for this run."""
    bare: Mapped[bool] = mapped_column(Boolean, server_default=text('false'))
    """Registered by a write (`stores/_bare.py`), not yet by `register_run`, whose one call fills the row in
    (revision 0007; runs stored before it were all registered)."""


class Conversation(Base):
    """One row per `conversation_id` among the runs: what `list_conversations` returns, kept up to date by
    the transactions that register and delete runs."""

    __tablename__ = 'conversations'
    __table_args__ = (Index('ix_conversations_last_started_at_conversation_id', 'last_started_at', 'conversation_id'),)

    conversation_id: Mapped[str] = mapped_column(String, primary_key=True)
    first_started_at: Mapped[datetime] = mapped_column(DateTimeUTC)
    last_started_at: Mapped[datetime] = mapped_column(DateTimeUTC)
    """The newest run's `started_at`."""
    run_count: Mapped[int] = mapped_column(BigInteger)
    head_run_pk: Mapped[int] = mapped_column(BigInteger)
    """`runs.id` of the newest run (ties of `started_at` go to the later registration)."""
    head_run_id: Mapped[str] = mapped_column(String)


class HistoryLine(Base):
    """A history line: the numbering of message rows that a chat's runs share (see `stores/_positions.py`).

    A line with a base (a branch) starts from the view `(base_line_id, base_length, base_through)`:
    its positions below `base_length` without a row of their own resolve there.
    """

    __tablename__ = 'history_lines'
    __table_args__ = (
        Index('ix_history_lines_base_line_id_base_through', 'base_line_id', 'base_through'),
        {'sqlite_autoincrement': True},
    )

    id: Mapped[int] = mapped_column(SERIAL, primary_key=True, autoincrement=True)
    """Never reused (`AUTOINCREMENT` on SQLite)."""
    last_message_no: Mapped[int] = mapped_column(BigInteger, server_default=text('0'))
    """`no` of the line's newest `messages` row (0 before the first): a save appends to the line only while
    this is still the `through` of the view it builds on."""
    base_line_id: Mapped[int | None] = mapped_column(BigInteger)
    base_length: Mapped[int | None] = mapped_column(Integer)
    base_through: Mapped[int | None] = mapped_column(BigInteger)


class Event(Base):
    """The append-only event log (`StepEvent`); append order is `id` order."""

    __tablename__ = 'events'
    __table_args__ = (
        Index('ix_events_run_id_id', 'run_id', 'id'),
        Index(
            'uq_events_run_id_idempotency_key',
            'run_id',
            'idempotency_key',
            unique=True,
            sqlite_where=IDEMPOTENCY_KEY_SET,
            postgresql_where=IDEMPOTENCY_KEY_SET,
        ),
    )

    id: Mapped[int] = mapped_column(SERIAL, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(String, ForeignKey('runs.run_id', ondelete='CASCADE'))
    kind: Mapped[str] = mapped_column(String)
    step_index: Mapped[int] = mapped_column(Integer)
    timestamp: Mapped[datetime] = mapped_column(DateTimeUTC)
    conversation_id: Mapped[str | None] = mapped_column(String)
    parent_run_id: Mapped[str | None] = mapped_column(String)
    agent_name: Mapped[str | None] = mapped_column(String)
    tool_call_id: Mapped[str | None] = mapped_column(String)
    tool_name: Mapped[str | None] = mapped_column(String)
    error: Mapped[str | None] = mapped_column(Text)
    metadata_: Mapped[dict[str, str]] = mapped_column('metadata', JSON_DOCUMENT)
    idempotency_key: Mapped[str | None] = mapped_column(String)
    model_name: Mapped[str | None] = mapped_column(String)
    input_tokens: Mapped[int | None] = mapped_column(BigInteger)
    """`StepEvent.usage`, in four columns: all four `NULL` (an event without usage, or written before revision
    0006) or none."""
    output_tokens: Mapped[int | None] = mapped_column(BigInteger)
    cache_read_tokens: Mapped[int | None] = mapped_column(BigInteger)
    cache_write_tokens: Mapped[int | None] = mapped_column(BigInteger)


class Message(Base):
    """Every version of every message position of a history line, each stored once.

    Row `no` (numbered per line, in the order rows are written) holds a version of the message at
    `position` of the histories of the line. A save writes rows only for the positions whose
    message differs from the view it builds on; a snapshot names its messages with its line,
    `history_length` and `through_message` (see `Snapshot`).
    """

    __tablename__ = 'messages'
    __table_args__ = (Index('ix_messages_line_id_position_no', 'line_id', 'position', 'no'),)

    line_id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    """`history_lines.id`."""
    no: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    position: Mapped[int] = mapped_column(Integer)
    """The message's index in the history (0 is the first message)."""
    digest: Mapped[str] = mapped_column(String(64))
    """SHA-256 (hex) of the message's JSON encoding (before any payload moved to the media store)."""
    body: Mapped[Any] = mapped_column(EncodedJSON)
    """The message as pydantic-ai's JSON (`ModelMessagesTypeAdapter` format, one message)."""
    externalized: Mapped[bool] = mapped_column(Boolean)
    """Whether `body` holds media markers: large payloads live in the media store, put back on read."""


class Snapshot(Base):
    """A continuable snapshot: its fields, and its view of a history line.

    Message `i` of the history (`0 <= i < history_length`) is the row of line `line_id` at
    position `i` with the highest `no` that is at most `through_message`, or, without one, message
    `i` of the line's base view. Three integers, whatever the length of the history.
    """

    __tablename__ = 'snapshots'
    __table_args__ = (
        Index('ix_snapshots_run_id_state_seq', 'run_id', 'state', 'seq'),
        Index('ix_snapshots_line_id_through_message', 'line_id', 'through_message'),
        Index('ix_snapshots_conversation_id_history_digest', 'conversation_id', 'history_digest'),
    )

    run_id: Mapped[str] = _run_fk()
    seq: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    step_index: Mapped[int] = mapped_column(Integer)
    timestamp: Mapped[datetime] = mapped_column(DateTimeUTC)
    conversation_id: Mapped[str | None] = mapped_column(String)
    parent_run_id: Mapped[str | None] = mapped_column(String)
    agent_name: Mapped[str | None] = mapped_column(String)
    idempotency_key: Mapped[str | None] = mapped_column(String)
    line_id: Mapped[int | None] = mapped_column(BigInteger)
    """The history line of the snapshot's view (`NULL`: an empty history, which needs none)."""
    history_length: Mapped[int] = mapped_column(Integer)
    """How many messages the snapshot's history has."""
    through_message: Mapped[int] = mapped_column(BigInteger)
    """The newest `messages.no` of the line the history may use."""
    history_digest: Mapped[str | None] = mapped_column(String(64))
    """`ContinuableSnapshot.history_digest()` of the history (`NULL` for snapshots saved before revision 0005)."""
    state: Mapped[str] = mapped_column(String, server_default='complete')


class SnapshotKey(Base):
    """Every snapshot idempotency key a run has used; outlives the pruning of its snapshot."""

    __tablename__ = 'snapshot_keys'

    run_id: Mapped[str] = _run_fk()
    idempotency_key: Mapped[str] = mapped_column(String, primary_key=True)


class ToolEffect(Base):
    """The tool-effect ledger (`ToolEffectRecord`), one row per `(run_id, tool_call_id)`."""

    __tablename__ = 'tool_effects'
    __table_args__ = (Index('ix_tool_effects_run_id_status_started_at', 'run_id', 'status', 'started_at'),)

    run_id: Mapped[str] = _run_fk()
    tool_call_id: Mapped[str] = mapped_column(String, primary_key=True)
    tool_name: Mapped[str] = mapped_column(String)
    status: Mapped[str] = mapped_column(String)
    started_at: Mapped[datetime] = mapped_column(DateTimeUTC)
    ended_at: Mapped[datetime | None] = mapped_column(DateTimeUTC)
    idempotency_key: Mapped[str | None] = mapped_column(String)
    effect_summary: Mapped[str | None] = mapped_column(Text)


class Media(Base):
    """Content-addressed blobs (the SQL media store); shared by runs, never deleted with one."""

    __tablename__ = 'media'

    digest: Mapped[str] = mapped_column(String(64), primary_key=True)
    """SHA-256 (hex) of `data`: the blob's media URI is `media+sha256://<digest>`."""
    data: Mapped[bytes] = mapped_column(LargeBinary)
    media_type: Mapped[str | None] = mapped_column(String)
    filename: Mapped[str | None] = mapped_column(String)
    metadata_: Mapped[dict[str, str]] = mapped_column('metadata', JSON_DOCUMENT)
    created_at: Mapped[datetime] = mapped_column(DateTimeUTC)
    touched_at: Mapped[datetime | None] = mapped_column(DateTimeUTC)
    """When the blob was last put again or reused (`NULL`: never since `created_at`); `collect_media`
    deletes an unreferenced blob only when this (or `created_at`) is older than its grace."""


runs: Table = Base.metadata.tables['runs']
conversations: Table = Base.metadata.tables['conversations']
history_lines: Table = Base.metadata.tables['history_lines']
events: Table = Base.metadata.tables['events']
messages: Table = Base.metadata.tables['messages']
snapshots: Table = Base.metadata.tables['snapshots']
snapshot_keys: Table = Base.metadata.tables['snapshot_keys']
tool_effects: Table = Base.metadata.tables['tool_effects']
media: Table = Base.metadata.tables['media']

VIEWS = MetaData()
"""The reporting views, described as tables (never created from here: migrations 0003 and 0006 do), in a metadata of
their own so that `Base.metadata` (what the migrations are compared with) holds the tables only."""

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


TABLE_NAMES: frozenset[str] = frozenset(Base.metadata.tables)
"""The tables this library owns (besides `VERSION_TABLE`)."""
