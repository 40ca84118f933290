"""`DatabaseStore`: what the SQL step store and the SQL media store share, a `Database` and its schema.

Either store opens a `Database` (or, as a step store's default media store, is given the step
store's), creates or upgrades the tables on its first operation when it migrates automatically,
and closes only what it owns. Stores sharing one `Database` share what it knows of its schema, so
the pair migrates once.
"""

from __future__ import annotations

from step_persistence._closing import ClosesOnExit
from step_persistence.stores.sql.database import Database

__all__ = ['DatabaseStore']


class DatabaseStore(ClosesOnExit):
    """A store on one `Database`: its schema made ready on first use, and closed if the store owns it."""

    _db: Database
    _auto_migrate: bool
    _owns_database: bool

    def _attach(self, database: Database, *, auto_migrate: bool, owns_database: bool = True) -> None:
        """Use `database` from now on; `owns_database`: `aclose()` closes it (what the store opened itself)."""
        self._db = database
        self._auto_migrate = auto_migrate
        self._owns_database = owns_database

    def __repr__(self) -> str:
        return f'{type(self).__name__}({self._db.description})'

    async def migrate(self) -> None:
        """Create or upgrade the schema to the newest revision (what `auto_migrate` does on first use)."""
        from step_persistence.stores.sql.migrate import upgrade  # Alembic is imported only to migrate

        await upgrade(self._db)
        self._db.migrated = True

    async def ready_database(self) -> Database:
        """The store's database, its schema created or upgraded first when the store migrates automatically.

        For step_persistence's own use: the reporting views (`stores/sql/reporting.py`) are read
        through it.
        """
        await self._ready()
        return self._db

    async def _ready(self) -> None:
        """With `auto_migrate`, migrate unless the database is known to be up to date; concurrent callers
        wait for one migration."""
        database = self._db
        if not self._auto_migrate or database.migrated:
            return
        async with database.migration_lock:
            if not database.migrated:
                await self.migrate()

    async def aclose(self) -> None:
        """Dispose of the engine if the store created it from a URL; a caller's engine or connection, and a
        database shared with another store, are left alone."""
        if self._owns_database:
            await self._db.aclose()
