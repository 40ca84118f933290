"""Statements that a store runs straight on its own engine's DBAPI connection (SQLite, asyncpg).

SQLAlchemy Core's execution path (compiled-cache lookup, execution context, parameter and result
processing, event dispatch) costs several times what SQLite itself spends on a small `INSERT`.
The statements a flush executes at every agent step are therefore declared as `Prepared`: a
Core statement, built from the schema like every other, that the store compiles once per set of
parameter names and then executes with a cursor of the DBAPI connection under the store's
connection (`sqlite3`, or SQLAlchemy's adapted asyncpg connection inside `run_sync`),
converting each value with the same bind processor Core would apply: the same SQL text, the
same values, the same cursor call Core would end in. On an application's engine, connection or
session (asyncpg or psycopg 3), or with execution options (a PostgreSQL schema's
`schema_translate_map`), the same Core statement runs through Core.

A statement qualifies for the driver only if its compiled form is positional, expands no
parameter lists, and returns no column whose type converts values on the way out; otherwise it
always runs through Core.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy.engine import Dialect
from sqlalchemy.exc import DBAPIError
from sqlalchemy.sql import Executable
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.elements import ClauseElement

__all__ = ['DriverResult', 'Prepared']


@dataclass(frozen=True, slots=True)
class _DriverStatement:
    sql: str
    pick: Callable[[Mapping[str, Any]], tuple[Any, ...]]
    """The positional values, in order, from the caller's parameters (and `constants`)."""
    processed: tuple[tuple[int, Callable[[Any], Any]], ...]
    """The positions whose values a bind processor converts, with that processor."""
    constants: Mapping[str, Any]
    """Values of the statement's own bound constants (the `1` of `seq + 1`), by parameter name."""

    def values(self, parameters: Mapping[str, Any]) -> Sequence[Any]:
        picked = self.pick({**self.constants, **parameters} if self.constants else parameters)
        if not self.processed:
            return picked
        converted = list(picked)
        for position, process in self.processed:
            converted[position] = process(converted[position])
        return converted


class Prepared:
    """A Core statement that may also run directly on a DBAPI connection (see the module docstring)."""

    __slots__ = ('_compiled', 'statement')

    def __init__(self, statement: Executable) -> None:
        self.statement = statement
        self._compiled: dict[tuple[Dialect, tuple[str, ...]], _DriverStatement | None] = {}

    def run(self, connection: Any, dialect: Dialect, parameters: Any) -> DriverResult | None:
        """Execute on the DBAPI `connection` (`parameters`: a dict, or a list of dicts for many rows);
        `None` if the statement does not qualify, and nothing was executed."""
        many = isinstance(parameters, list)
        if many and not parameters:
            return None
        first: Mapping[str, Any] = parameters[0] if many else (parameters or {})
        key = (dialect, tuple(first))
        try:
            compiled = self._compiled[key]
        except KeyError:
            compiled = self._compiled[key] = _compile(self.statement, dialect, key[1])
        if compiled is None:
            return None
        values = [compiled.values(each) for each in parameters] if many else compiled.values(first)
        cursor = connection.cursor()
        dbapi_error: type[Exception] = dialect.loaded_dbapi.Error
        try:
            if many:
                cursor.executemany(compiled.sql, values)
            else:
                cursor.execute(compiled.sql, values)
        except dbapi_error as error:
            # Raised as Core raises it, so callers handle one kind of error whichever path ran.
            raise DBAPIError.instance(compiled.sql, values, error, dbapi_error, dialect=dialect) from error
        return DriverResult(cursor)


def _compile(statement: Executable, dialect: Dialect, names: Sequence[str]) -> _DriverStatement | None:
    if not isinstance(statement, ClauseElement):
        return None
    compiled = statement.compile(dialect=dialect, column_keys=list(names))
    if not isinstance(compiled, SQLCompiler) or compiled.positiontup is None:
        return None
    binds = compiled.binds
    if any(bind.expanding or bind.literal_execute for bind in binds.values()):
        return None
    returned = getattr(statement, 'exported_columns', ())
    if any(column.type.dialect_impl(dialect).result_processor(dialect, None) is not None for column in returned):
        return None
    ordered = tuple(compiled.positiontup)
    constants = {name: binds[name].value for name in ordered if name not in names}
    if any(binds[name].callable is not None or binds[name].required for name in constants):
        return None
    processors = (binds[name].type.dialect_impl(dialect).bind_processor(dialect) for name in ordered)
    processed = tuple((position, process) for position, process in enumerate(processors) if process is not None)
    return _DriverStatement(compiled.string, _picker(ordered), processed, constants)


def _picker(names: tuple[str, ...]) -> Callable[[Mapping[str, Any]], tuple[Any, ...]]:
    if len(names) == 1:
        name = names[0]
        return lambda parameters: (parameters[name],)
    return operator.itemgetter(*names)


class DriverResult:
    """The part of a `CursorResult` the store uses, over a DBAPI cursor."""

    __slots__ = ('_cursor',)

    def __init__(self, cursor: Any) -> None:
        self._cursor = cursor

    @property
    def rowcount(self) -> int:
        return int(self._cursor.rowcount)

    def first(self) -> tuple[Any, ...] | None:
        row: tuple[Any, ...] | None = self._cursor.fetchone()
        self._cursor.close()
        return row

    def all(self) -> list[tuple[Any, ...]]:
        rows: list[tuple[Any, ...]] = self._cursor.fetchall()
        self._cursor.close()
        return rows

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        return iter(self.all())
