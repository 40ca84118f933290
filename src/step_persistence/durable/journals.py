"""`journal_for`: the durable journal of a store, kept in the same storage as its runs."""

from __future__ import annotations

import sys

from step_persistence.durable.protocol import JournalStore
from step_persistence.media.protocol import MediaStore
from step_persistence.protocol import StepStore
from step_persistence.stores._media import DEFAULT_THRESHOLD_BYTES, MessageMedia

__all__ = ['JOURNAL_BACKENDS', 'journal_for', 'journal_media']

JOURNAL_BACKENDS = ('InMemoryStepStore', 'SqlStepStore (SQLite, PostgreSQL)', 'MongoStepStore', 'FileStepStore')
"""The stores that hold a journal."""


def journal_for(store: StepStore) -> JournalStore:
    """The journal of `store`: the store itself when it implements `JournalStore` (the memory store, or a
    third-party store), a `SqlJournal`, `MongoJournal` or `FileJournal` in the storage of a SQL, MongoDB or
    file store; `TypeError` for a store that has none."""
    if isinstance(store, JournalStore):
        return store
    # A backend's store exists only once its module is imported: a process without one imports no driver here.
    sql_store = sys.modules.get('step_persistence.stores.sql.store')
    if sql_store is not None and isinstance(store, sql_store.SqlStepStore):
        from step_persistence.stores.sql.journal import SqlJournal

        return SqlJournal(store)
    mongo_store = sys.modules.get('step_persistence.stores.mongo.store')
    if mongo_store is not None and isinstance(store, mongo_store.MongoStepStore):
        from step_persistence.stores.mongo.journal import MongoJournal

        return MongoJournal(store)
    file_store = sys.modules.get('step_persistence.stores.file.store')
    if file_store is not None and isinstance(store, file_store.FileStepStore):
        from step_persistence.stores.file.journal import FileJournal

        return FileJournal(store)
    raise TypeError(
        f'{type(store).__name__} holds no durable journal: durable replay runs on {", ".join(JOURNAL_BACKENDS)} '
        '(or a store implementing step_persistence.durable.JournalStore); use StepPersistence alone and '
        'continue_run to recover on this store'
    )


def journal_media(store: StepStore) -> MessageMedia:
    """Where the journal of `store` puts the media of unit results: the store's own media store and threshold
    (`media_store`, `media_threshold_bytes`), as its snapshots do; inline for a store without one."""
    media_store = getattr(store, 'media_store', None)
    threshold = getattr(store, 'media_threshold_bytes', DEFAULT_THRESHOLD_BYTES)
    return MessageMedia.resolve(media_store if isinstance(media_store, MediaStore) else None, threshold, default=None)
