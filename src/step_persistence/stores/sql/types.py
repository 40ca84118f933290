"""Column types that behave the same on SQLite and PostgreSQL.

- `DateTimeUTC`: an instant. PostgreSQL stores it as `timestamptz`; SQLite, which has no time
  zones, as fixed-width UTC text (`YYYY-MM-DD HH:MM:SS.ffffff`), so `ORDER BY` on it orders by
  instant. Naive datetimes are refused on the way in; values come back as aware UTC datetimes.
- `JSON_DOCUMENT`: `JSON`, stored as `JSONB` on PostgreSQL (`JSONDocument`).
- `EncodedJSON`: a JSON column written from JSON text the caller already produced (bytes or
  str), so a message serialized once by the capability is not parsed and serialized again. It is
  `JSON` on PostgreSQL too (not `JSONB`): `json` keeps the text exactly as written, so a message
  reads back with its original key order (tool-call arguments included) and a continued run
  sends the provider the same bytes as the original one.

Reading a damaged value (set behind the store's back: text that is not JSON or not an instant on
SQLite, an infinite instant or one outside Python's years on PostgreSQL) must not fail the whole
query it is in. The store reads such columns through `Tolerant`, which gives `Unreadable` for a
value its type cannot decode, so that the row is skipped (and logged) alone; on PostgreSQL, whose
driver decodes JSON and instants itself, `EpochInstant` and `JSONText` read them again in a form
that cannot fail in the driver (see `rows.careful`).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import JSON, DateTime
from sqlalchemy.engine import Dialect
from sqlalchemy.types import NullType, TypeDecorator, TypeEngine

from step_persistence.records import require_utc

__all__ = [
    'JSON_DOCUMENT',
    'DateTimeUTC',
    'EncodedJSON',
    'EpochInstant',
    'JSONDocument',
    'JSONText',
    'Tolerant',
    'Unreadable',
]


class JSONDocument(TypeDecorator[Any]):
    """A JSON document: `JSON`, or `JSONB` on PostgreSQL, whose type SQLAlchemy's PostgreSQL dialect
    supplies when a statement or DDL is compiled for PostgreSQL (so declaring the column imports no
    dialect). As `JSON`, Python's `None` is stored as JSON `null`."""

    impl = JSON
    cache_ok = True
    should_evaluate_none = True

    def load_dialect_impl(self, dialect: Dialect) -> TypeEngine[Any]:
        if dialect.name == 'postgresql':
            from sqlalchemy.dialects.postgresql import JSONB

            return dialect.type_descriptor(JSONB())
        return dialect.type_descriptor(JSON())


JSON_DOCUMENT: TypeEngine[Any] = JSONDocument()
"""A JSON document column (`JSONDocument`)."""


class DateTimeUTC(TypeDecorator[datetime]):
    """A timezone-aware instant; refuses naive datetimes and always reads back aware UTC values."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if not isinstance(value, datetime):
            raise TypeError(f'expected a datetime, got {type(value).__name__}')
        instant = require_utc(value)
        return instant.replace(tzinfo=None) if dialect.name == 'sqlite' else instant

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is not None:
            return value.astimezone(UTC)
        if dialect.name == 'postgresql':
            # asyncpg gives aware values for `timestamptz`, except for 'infinity' and '-infinity' (naive
            # `datetime.max` and `datetime.min`): never an instant the store wrote.
            raise ValueError(f'an infinite timestamp ({value.isoformat()} as the driver reads it)')
        return value.replace(tzinfo=UTC)


class EncodedJSON(TypeDecorator[Any]):
    """A `JSON` column bound from already-encoded JSON text (bytes or str), stored verbatim."""

    impl = JSON
    cache_ok = True

    def bind_processor(self, dialect: Dialect) -> Any:
        def process(value: bytes | str | None) -> str | None:
            if isinstance(value, bytes):
                return value.decode('utf-8')
            return value

        return process


class Unreadable:
    """A stored value that its column's type could not decode (what `Tolerant` gives instead of raising)."""

    __slots__ = ('error',)

    def __init__(self, error: Exception) -> None:
        self.error = error

    def __repr__(self) -> str:
        return f'Unreadable({self.error!r})'


class Tolerant(TypeDecorator[Any]):
    """`wrapped`'s result processing, except that a value it cannot decode reads as `Unreadable`.

    For reading only (`type_coerce(column, Tolerant(column.type))`): one damaged value then makes
    its row unreadable, not the query.
    """

    impl = NullType
    cache_ok = True

    def __init__(self, wrapped: TypeEngine[Any]) -> None:
        super().__init__()
        self.wrapped = wrapped

    def result_processor(self, dialect: Dialect, coltype: object) -> Any:
        process = self.wrapped.dialect_impl(dialect).result_processor(dialect, coltype)
        if process is None:
            return None

        def tolerant(value: Any) -> Any:
            try:
                return process(value)
            except Exception as error:  # RecursionError (JSON nested too deep) included
                return Unreadable(error)

        return tolerant


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class EpochInstant(TypeDecorator[datetime]):
    """An instant read as seconds since the epoch (PostgreSQL's exact `EXTRACT(EPOCH FROM ...)`).

    `OverflowError` for an infinite instant or one outside Python's years 1 to 9999, which asyncpg
    cannot decode as a `datetime` at all (it fails the whole query).
    """

    impl = NullType
    cache_ok = True

    def process_result_value(self, value: Any, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return _EPOCH + timedelta(microseconds=round(value * 1_000_000))


class JSONText(TypeDecorator[Any]):
    """A JSON document read as its text and decoded here (`RecursionError` for one nested too deep)."""

    impl = NullType
    cache_ok = True

    def process_result_value(self, value: Any, dialect: Dialect) -> Any:
        return None if value is None else json.loads(value)
