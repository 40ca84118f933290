"""The names a SQL store's schema has in one database: the declared names, or all of them with a prefix.

`table_prefix='sp_'` puts `sp_` in front of every table (`sp_runs`, `sp_messages`...), view
(`sp_run_summary`), the version table (`sp_step_persistence_alembic_version`) and every index
and constraint, whose names embed their table's (`ix_sp_runs_started_at_id`, `pk_sp_media`), as
the naming convention of `schema.py` would name them on the prefixed tables. The schema is still
declared once, in `schema.py`, under the default names: the store's statements are written
against those tables and `TableNames.translate` rewrites each one onto the prefixed tables, once
per statement (the result is cached); the migrations name everything through
`TableNames.table` and `TableNames.object` (see `migrations/naming.py`).
"""

from __future__ import annotations

import functools
import re
import threading
from collections.abc import Iterable, Mapping
from typing import Any, TypeVar

from sqlalchemy import Column, ForeignKeyConstraint, Index, MetaData, Table, UniqueConstraint
from sqlalchemy.sql import Executable, visitors

from step_persistence._lru import BoundedLru
from step_persistence.stores.sql.prepared import Prepared
from step_persistence.stores.sql.schema import (
    NAMING_CONVENTION,
    TABLES,
    VERSION_TABLE,
    VIEWS,
    with_postgresql_predicates,
)

__all__ = [
    'CLASH_REMEDY',
    'DEFAULT_NAMES',
    'SchemaClash',
    'TableNames',
    'check_media_table',
    'check_table_prefix',
    'include_name',
    'names_of',
    'table_names',
]

S = TypeVar('S', bound=Executable | Prepared)

_PREFIX = re.compile(r'[a-z][a-z0-9_]{0,14}')
"""Lower case (raw SQL of the views names tables unquoted, which PostgreSQL folds to lower case), and short
enough that the longest name (an index of 48 characters) stays within PostgreSQL's 63."""

_TRANSLATED_STATEMENTS = 1024
"""Statements whose prefixed form a `TableNames` keeps (the stores' statements are built once; a statement
built per call is translated again when it comes back)."""


def check_table_prefix(prefix: object) -> str:
    """`prefix` if it can start the store's names: `''` (the declared names), or 1 to 15 lower-case letters,
    digits and underscores starting with a letter; else `TypeError`/`ValueError`."""
    if not isinstance(prefix, str):
        raise TypeError(f'table_prefix must be a string, got {type(prefix).__name__}')
    if prefix and not _PREFIX.fullmatch(prefix):
        raise ValueError(
            f'table_prefix={prefix!r}: use 1 to 15 lower-case letters, digits or underscores, starting with a '
            "letter (for example 'sp_')"
        )
    return prefix


_MEDIA_TABLE = re.compile(r'[a-z][a-z0-9_]{0,59}')
"""A table name the store's statements and constraint names (`pk_<table>`) can use unquoted on both dialects."""


def check_media_table(name: object) -> str:
    """`name` if it can name a media store's own blob table (lower-case letters, digits and underscores,
    starting with a letter, at most 60); else `TypeError`/`ValueError`."""
    if not isinstance(name, str):
        raise TypeError(f'table must be a string, got {type(name).__name__}')
    if not _MEDIA_TABLE.fullmatch(name):
        raise ValueError(
            f'table={name!r}: use 1 to 60 lower-case letters, digits or underscores, starting with a letter'
        )
    return name


CLASH_REMEDY = (
    'if step-persistence created them, record the revision they are at with `step-persistence db stamp REV`; '
    "if they belong to the application, give the store a table_prefix (table_prefix='sp_', or ?table_prefix=sp_ "
    "in the store URL) or, on PostgreSQL, a schema of its own (schema='steps')"
)
"""What to do about tables named as the store's in a database that records no revision of its migrations."""


class SchemaClash(RuntimeError):
    """The database already holds tables with the store's names that step-persistence did not record creating."""


class TableNames:
    """Every name of the store's schema in one database (`prefix` in front of each; `''`: as declared), and
    the name of the media table when a media store keeps its blobs in a table of its own (`media_table`)."""

    def __init__(self, prefix: str = '', *, media_table: str | None = None) -> None:
        self.prefix = check_table_prefix(prefix)
        self.media_table = None if media_table is None else check_media_table(media_table)
        """The blob table of a media store given `table=` (created by that store, outside the migrations)."""
        self.version_table = prefix + VERSION_TABLE
        """Alembic's version table of these migrations."""
        declared = [*TABLES.sorted_tables, *VIEWS.sorted_tables]
        self._declared_names = sorted((table.name for table in declared), key=len, reverse=True)
        self._tables: dict[Table, Table] = {}
        self.renames = bool(prefix or media_table)
        """Whether any name differs from the declared one."""
        if self.renames:
            renamed = MetaData()
            self._tables = {table: _renamed_columns(table, renamed, self.table(table.name)) for table in declared}
        self._translated: BoundedLru[int, tuple[Any, Any]] = BoundedLru(_TRANSLATED_STATEMENTS)
        self._metadata: MetaData | None = None
        self._lock = threading.Lock()

    @property
    def tables(self) -> frozenset[str]:
        """The names of the store's tables (not the views, not the version table)."""
        return frozenset(self.table(name) for name in TABLES.tables)

    def table(self, name: str) -> str:
        """The name of the table or view declared as `name`."""
        if name == 'media' and self.media_table is not None:
            return self.media_table
        return self.prefix + name

    def object(self, name: str) -> str:
        """The name of the index or constraint declared as `name` (`<kind>_<table>_...`, a foreign key's ending
        with the table it refers to): each table name in it prefixed."""
        if not self.renames:
            return name
        kind, _, rest = name.partition('_')
        table = next((each for each in self._declared_names if rest == each or rest.startswith(each + '_')), None)
        if table is None:
            raise ValueError(f'{name!r} names no table of the schema')
        rest = self.table(table) + rest[len(table) :]
        if kind == 'fk':
            referred = next(each for each in self._declared_names if rest.endswith('_' + each))
            rest = rest[: -len(referred)] + self.table(referred)
        return f'{kind}_{rest}'

    def translate(self, statement: S) -> S:
        """`statement` (Core, or `Prepared`) on the tables of these names: itself when no name differs."""
        if not self.renames:
            return statement
        key = id(statement)
        with self._lock:  # SQLite stores run their operations on several threads
            cached = self._translated.get(key)
        if cached is not None and cached[0] is statement:
            translated: S = cached[1]
            return translated
        if isinstance(statement, Prepared):
            translated = Prepared(self._rewrite(statement.statement))  # type: ignore[assignment]
        else:
            translated = self._rewrite(statement)
        with self._lock:
            self._translated.put(key, (statement, translated))
        return translated

    def _rewrite(self, statement: Any) -> Any:
        tables = self._tables

        def replace(element: Any, **_: Any) -> Any:
            if isinstance(element, Table):
                return tables.get(element)
            if isinstance(element, Column) and isinstance(element.table, Table) and element.table in tables:
                return tables[element.table].c[element.key]
            return None

        return visitors.replacement_traverse(statement, {}, replace)

    def metadata(self) -> MetaData:
        """The schema under these names, indexes and constraints included (what the migrations create), for
        comparing a database against it and for Alembic's autogenerate."""
        if not self.renames:
            return with_postgresql_predicates(TABLES)
        if self._metadata is None:
            self._metadata = with_postgresql_predicates(_prefixed_metadata(self))
        return self._metadata

    def owns(self, name: str | None) -> bool:
        """Whether a table named `name` is one of the store's (or its version table)."""
        return name in self.tables or name == self.version_table

    def include_name(self, name: str | None, type_: str, parent_names: Mapping[str, str | None]) -> bool:
        """Alembic `include_name` hook for an application sharing the database: skip the store's tables.

        Pass it to `context.configure(include_name=...)` in the application's `env.py` so that
        `alembic revision --autogenerate` neither drops nor alters step-persistence's tables.
        """
        return type_ != 'table' or not self.owns(name)

    def clash(self, found: Iterable[str], *, where: str = 'the database') -> SchemaClash:
        """The error for `where` (a database without a recorded revision) holding tables named as the store's."""
        return SchemaClash(
            f'{where} already holds tables named {", ".join(sorted(found))} but records no schema revision of '
            f'step-persistence: {CLASH_REMEDY}'
        )

    def __repr__(self) -> str:
        media = '' if self.media_table is None else f', media_table={self.media_table!r}'
        return f'TableNames(prefix={self.prefix!r}{media})'


def _renamed_columns(table: Table, metadata: MetaData, name: str, **options: Any) -> Table:
    """A table named `name` with `table`'s columns (what statements need: names, keys, types, keys of rows)."""
    columns = [
        Column(
            column.name,
            column.type,
            key=column.key,
            primary_key=column.primary_key,
            nullable=column.nullable,
            autoincrement=column.autoincrement,
            server_default=column.server_default,
        )
        for column in table.columns
    ]
    return Table(name, metadata, *columns, **options)


def _prefixed_metadata(names: TableNames) -> MetaData:
    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    for table in TABLES.sorted_tables:
        copy = _renamed_columns(table, metadata, names.table(table.name), **table.dialect_kwargs)
        copy.primary_key.name = names.object(str(table.primary_key.name))
        for constraint in table.constraints:
            if isinstance(constraint, UniqueConstraint):
                copy.append_constraint(
                    UniqueConstraint(
                        *(column.name for column in constraint.columns), name=names.object(str(constraint.name))
                    )
                )
            elif isinstance(constraint, ForeignKeyConstraint):
                referred = constraint.referred_table.name
                copy.append_constraint(
                    ForeignKeyConstraint(
                        [element.parent.name for element in constraint.elements],
                        [f'{names.table(referred)}.{element.column.name}' for element in constraint.elements],
                        name=names.object(str(constraint.name)),
                        ondelete=constraint.ondelete,
                    )
                )
        for index in table.indexes:
            Index(
                names.object(str(index.name)),
                *(copy.c[column.key] for column in index.columns),
                unique=index.unique,
                info=dict(index.info),
                **index.dialect_kwargs,
            )
    return metadata


@functools.cache
def table_names(prefix: str = '', *, media_table: str | None = None) -> TableNames:
    """The `TableNames` of `prefix` (and `media_table`), one per process (so stores with the same names share
    translations)."""
    return TableNames(check_table_prefix(prefix), media_table=media_table)


DEFAULT_NAMES = table_names('')
"""The declared names."""


def include_name(name: str | None, type_: str, parent_names: Mapping[str, str | None]) -> bool:
    """Alembic `include_name` hook for an application sharing the database with a store of the declared names
    (`table_names(prefix).include_name` for a store with a table prefix): skip the store's tables."""
    return DEFAULT_NAMES.include_name(name, type_, parent_names)


def names_of(options: Mapping[str, Any]) -> TableNames:
    """The names an Alembic migration context was configured with (`table_names` option; default: declared)."""
    names = options.get('table_names', DEFAULT_NAMES)
    if not isinstance(names, TableNames):
        raise TypeError(f'table_names must be TableNames, got {type(names).__name__}')
    return names
