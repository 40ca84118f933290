"""Column types that behave the same on SQLite and PostgreSQL.

- `DateTimeUTC`: an instant. PostgreSQL stores it as `timestamptz`; SQLite, which has no time
  zones, as fixed-width UTC text (`YYYY-MM-DD HH:MM:SS.ffffff`), so `ORDER BY` on it orders by
  instant. Naive datetimes are refused on the way in; values come back as aware UTC datetimes.
- `JSON_DOCUMENT`: `JSON`, stored as `JSONB` on PostgreSQL.
- `EncodedJSON`: a JSON column written from JSON text the caller already produced (bytes or
  str), so a message serialized once by the capability is not parsed and serialized again. It is
  `JSON` on PostgreSQL too (not `JSONB`): `json` keeps the text exactly as written, so a message
  reads back with its original key order (tool-call arguments included) and a continued run
  sends the provider the same bytes as the original one.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import JSON, DateTime
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.engine import Dialect
from sqlalchemy.types import TypeDecorator, TypeEngine

from step_persistence.records import require_utc

__all__ = ['JSON_DOCUMENT', 'DateTimeUTC', 'EncodedJSON']

JSON_DOCUMENT: TypeEngine[Any] = JSON().with_variant(JSONB(), 'postgresql')
"""A JSON document column: `JSON`, or `JSONB` on PostgreSQL."""


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
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


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
