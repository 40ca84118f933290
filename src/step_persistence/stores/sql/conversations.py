"""The `conversations` table: one summary per `conversation_id`, kept by the transactions that register and
delete runs, and the queries of `list_conversations`.

Registering a run upserts its conversation's row (`INSERT ... ON CONFLICT DO UPDATE`: one more run,
and the new run as the head when it is the newest by `started_at`, ties by registration order, so
concurrent registrations on PostgreSQL serialize on that row and never lose a count). Deleting a
run first takes the row (`UPDATE` of its count, which locks it on PostgreSQL), then drops it when
no run is left or reads the first and newest runs again from `ix_runs_conversation_id_started_at_id`.

`list_conversations` reads the table through `ix_conversations_last_started_at_conversation_id`
in order, up to its limit; with `agent_name`, the summaries are computed from that agent's runs
(`ix_runs_agent_name_conversation_id_started_at_id`), which a table per agent is not kept for.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from sqlalchemy import and_, bindparam, case, delete, exists, func, or_, select, update
from sqlalchemy.sql import Select
from sqlalchemy.sql.elements import BindParameter

from step_persistence.records import ConversationSummary, RunRecord
from step_persistence.stores.sql.dialects import dialect_insert
from step_persistence.stores.sql.executors import Transaction
from step_persistence.stores.sql.prepared import Prepared
from step_persistence.stores.sql.rows import readable, require_readable
from step_persistence.stores.sql.schema import conversations, runs

__all__ = ['run_deleted', 'run_registered', 'summaries_query', 'summary_from_row']

_FIELDS = ('conversation_id', 'first_started_at', 'last_started_at', 'run_count', 'head_run_id')


@functools.cache
def _upsert(dialect_name: str) -> Prepared:
    statement = dialect_insert(dialect_name)(conversations)
    new, stored = statement.excluded, conversations.c
    newer = or_(
        new.last_started_at > stored.last_started_at,
        and_(new.last_started_at == stored.last_started_at, new.head_run_pk > stored.head_run_pk),
    )
    return Prepared(
        statement.on_conflict_do_update(
            index_elements=[stored.conversation_id],
            set_={
                'run_count': stored.run_count + 1,
                'first_started_at': case(
                    (new.first_started_at < stored.first_started_at, new.first_started_at),
                    else_=stored.first_started_at,
                ),
                'last_started_at': case((newer, new.last_started_at), else_=stored.last_started_at),
                'head_run_pk': case((newer, new.head_run_pk), else_=stored.head_run_pk),
                'head_run_id': case((newer, new.head_run_id), else_=stored.head_run_id),
            },
        )
    )


def run_registered(transaction: Transaction, record: RunRecord, run_pk: int) -> None:
    """Count the run just inserted (`runs.id` `run_pk`) in its conversation's summary."""
    if record.conversation_id is None:
        return
    values = {
        'conversation_id': record.conversation_id,
        'first_started_at': record.started_at,
        'last_started_at': record.started_at,
        'run_count': 1,
        'head_run_pk': run_pk,
        'head_run_id': record.run_id,
    }
    transaction.execute(_upsert(transaction.connection.dialect.name), values)


_CONVERSATION: BindParameter[Any] = bindparam('conversation')
_TAKE = (
    update(conversations)
    .where(conversations.c.conversation_id == _CONVERSATION)
    .values(run_count=conversations.c.run_count - 1)
)
_DROP_EMPTY = delete(conversations).where(
    conversations.c.conversation_id == _CONVERSATION,
    ~exists().where(runs.c.conversation_id == _CONVERSATION),
)


def _edge(column: Any, *, newest: bool) -> Any:
    order = (runs.c.started_at.desc(), runs.c.id.desc()) if newest else (runs.c.started_at, runs.c.id)
    return select(column).where(runs.c.conversation_id == _CONVERSATION).order_by(*order).limit(1).scalar_subquery()


_RECOUNT_EDGES = (
    update(conversations)
    .where(conversations.c.conversation_id == _CONVERSATION)
    .values(
        first_started_at=_edge(runs.c.started_at, newest=False),
        last_started_at=_edge(runs.c.started_at, newest=True),
        head_run_pk=_edge(runs.c.id, newest=True),
        head_run_id=_edge(runs.c.run_id, newest=True),
    )
)


def run_deleted(transaction: Transaction, conversation_id: str) -> None:
    """Update the summary of `conversation_id` after one of its runs was deleted in this transaction."""
    parameters = {'conversation': conversation_id}
    transaction.execute(_TAKE, parameters)  # first: on PostgreSQL it waits for registrations in flight
    transaction.execute(_DROP_EMPTY, parameters)
    transaction.execute(_RECOUNT_EDGES, parameters)


_SUMMARY_COLUMNS = tuple(readable(conversations.c[name]) for name in _FIELDS)

_agent_runs = (
    select(
        runs.c.conversation_id,
        func.min(runs.c.started_at).over(partition_by=runs.c.conversation_id).label('first_started_at'),
        runs.c.started_at.label('last_started_at'),
        func.count().over(partition_by=runs.c.conversation_id).label('run_count'),
        runs.c.run_id.label('head_run_id'),
        func.row_number()
        .over(partition_by=runs.c.conversation_id, order_by=(runs.c.started_at.desc(), runs.c.id.desc()))
        .label('newest'),
    )
    .where(runs.c.agent_name == bindparam('agent_name'), runs.c.conversation_id.is_not(None))
    .subquery('agent_runs')
)
_AGENT_COLUMNS = tuple(readable(_agent_runs.c[name]) for name in _FIELDS)


def summaries_query(*, limit: int | None, newest_first: bool, agent_name: str | None) -> Select[Any]:
    """The `list_conversations` query (parameter `agent_name` when one is given), in its order and limit."""
    if agent_name is None:
        table: Any = conversations
        statement = select(*_SUMMARY_COLUMNS)
    else:
        table = _agent_runs
        statement = select(*_AGENT_COLUMNS).where(_agent_runs.c.newest == 1)
    order = (table.c.last_started_at, table.c.conversation_id)
    statement = statement.order_by(*(column.desc() for column in order) if newest_first else order)
    return statement if limit is None else statement.limit(limit)


def summary_from_row(row: Mapping[str, Any]) -> ConversationSummary:
    """A summary read with `summaries_query`; `ValueError` for a damaged row."""
    require_readable(row, _FIELDS)
    return ConversationSummary.model_validate({name: row[name] for name in _FIELDS}, strict=True)
