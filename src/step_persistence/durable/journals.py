"""`journal_for`: the durable journal of a store, kept in the same storage as its runs."""

from __future__ import annotations

import sys

from step_persistence.durable.protocol import JournalStore
from step_persistence.protocol import StepStore

__all__ = ['JOURNAL_BACKENDS', 'journal_for']

JOURNAL_BACKENDS = ('InMemoryStepStore', 'SqlStepStore (SQLite, PostgreSQL)')
"""The stores that hold a journal today (the file and MongoDB stores do not yet)."""


def journal_for(store: StepStore) -> JournalStore:
    """The journal of `store`: the store itself when it implements `JournalStore` (the memory store, or a
    third-party store), a `SqlJournal` on a SQL store's database; `TypeError` for a store that has none."""
    if isinstance(store, JournalStore):
        return store
    # A SQL store exists only once its module is imported: a process without one never imports SQLAlchemy here.
    sql_store = sys.modules.get('step_persistence.stores.sql.store')
    if sql_store is not None and isinstance(store, sql_store.SqlStepStore):
        from step_persistence.stores.sql.journal import SqlJournal

        return SqlJournal(store)
    raise TypeError(
        f'{type(store).__name__} holds no durable journal: durable replay runs on {", ".join(JOURNAL_BACKENDS)} '
        'for now (the file and MongoDB journals are not written yet); use StepPersistence alone and '
        'continue_run to recover on this store'
    )
