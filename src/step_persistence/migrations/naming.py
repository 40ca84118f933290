"""The names a migration gives what it creates: those of the `TableNames` its context was configured with.

Every migration names its tables, views, indexes and constraints through `names()` (the declared
names, or each with the store's table prefix; see `stores/sql/naming.py`), so one history of
revisions serves every prefix.
"""

from __future__ import annotations

from alembic import context, op
from sqlalchemy import inspect

from step_persistence.stores.sql.naming import TableNames, names_of

__all__ = ['names', 'refuse_a_clash']


def names() -> TableNames:
    """The names of the running migration."""
    return names_of(op.get_context().opts)


def refuse_a_clash(tables: list[str]) -> None:
    """Before the first revision creates `tables` (declared names): raise `SchemaClash` if the database
    already holds a table of one of their names (online only: offline there is no database to look at)."""
    if context.is_offline_mode():
        return
    migration = op.get_context()
    current = names()
    existing = set(inspect(op.get_bind()).get_table_names(schema=migration.version_table_schema))
    found = existing & {current.table(name) for name in tables}
    if found:
        raise current.clash(found)
