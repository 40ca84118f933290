"""Round trips to PostgreSQL counted at the driver: each asyncpg protocol call that waits for the server.

SQLAlchemy's `begin` and `commit` events fire for a connection in autocommit too, where asyncpg sends
neither, so they do not count round trips. This counts what asyncpg itself sends: every call of its
protocol that writes to the socket and waits for the reply (a `prepare`, an `execute` of a prepared
statement, an `executemany`, a simple query such as `BEGIN` or `COMMIT`, closing a statement), on
every connection an engine opens from now on.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.pool import Pool

__all__ = ['count_round_trips', 'counting_every_engine']

_WAITING_CALLS = {
    'prepare': 'prepare',
    'bind_execute': 'execute',
    'bind_execute_many': 'executemany',
    'bind': 'execute',
    'execute': 'execute',
    'close_statement': 'close statement',
    'copy_in': 'copy',
    'copy_out': 'copy',
}
"""asyncpg's protocol methods that wait for the server, by the name they are counted under (`query`, a simple
query, is counted by its first word)."""


class _CountingProtocol:
    """An asyncpg protocol whose waiting calls are counted (everything else is the protocol's own)."""

    def __init__(self, protocol: Any, counts: Counter[str], statements: list[str] | None) -> None:
        self._protocol = protocol
        self._counts = counts
        self.statements = statements

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._protocol, name)
        counted = _WAITING_CALLS.get(name)
        if name == 'query':

            def query(text: str, *args: Any, **kwargs: Any) -> Any:
                self._counts[text.split(maxsplit=1)[0].rstrip(';').upper() if text.strip() else 'query'] += 1
                if self.statements is not None:
                    self.statements.append(f'query: {text}')
                return attribute(text, *args, **kwargs)

            return query
        if counted is None:
            return attribute

        def waiting(*args: Any, **kwargs: Any) -> Any:
            self._counts[counted] += 1
            if self.statements is not None:
                self.statements.append(f'{counted}: {_statement_of(name, args)}')
            return attribute(*args, **kwargs)

        return waiting


def _statement_of(name: str, args: tuple[Any, ...]) -> str:
    """The first words of the SQL a protocol call sends (a prepare's text, or a prepared statement's)."""
    query = args[1] if name == 'prepare' and len(args) > 1 else getattr(args[0], 'query', '') if args else ''
    return ' '.join(str(query).split()[:3])


def _counting(counts: Counter[str], statements: list[str] | None = None) -> Any:
    def on_connect(dbapi_connection: Any, record: Any) -> None:
        driver = dbapi_connection._connection
        driver._protocol = _CountingProtocol(driver._protocol, counts, statements)

    return on_connect


def count_round_trips(engine: AsyncEngine) -> Counter[str]:
    """A counter of the round trips every asyncpg connection `engine` opens from now on makes, by kind
    (`prepare`, `execute`, `executemany`, `BEGIN`, `COMMIT`, ...)."""
    counts: Counter[str] = Counter()
    event.listen(engine.sync_engine, 'connect', _counting(counts))
    return counts


@contextmanager
def counting_every_engine(statements: list[str] | None = None) -> Iterator[Counter[str]]:
    """`count_round_trips` for the connections of every engine opened meanwhile (a store's own, too); each
    round trip also described in `statements`, if given."""
    counts: Counter[str] = Counter()
    listener = _counting(counts, statements)
    event.listen(Pool, 'connect', listener)
    try:
        yield counts
    finally:
        event.remove(Pool, 'connect', listener)
