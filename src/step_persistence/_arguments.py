"""Checking the type of the ids and filters a store is called with, before any database sees them.

Ids can come from a model or a web request. A non-string that reached a database could mean
something else there (a MongoDB query operator such as `{'$ne': None}` matches every document),
so every store refuses it with `TypeError` first.
"""

from __future__ import annotations

__all__ = ['require_limit', 'require_text']


def require_text(name: str, value: object, *, optional: bool = False) -> None:
    """Raise `TypeError` unless `value` is a `str` (or `None`, when `optional`); `name` is the argument."""
    if isinstance(value, str) or (optional and value is None):
        return
    expected = 'a string or None' if optional else 'a string'
    raise TypeError(f'{name} must be {expected}, not {type(value).__name__}')


def require_limit(limit: object) -> int | None:
    """Return `limit` if it is `None` or an `int` of at least 1; else raise `TypeError`/`ValueError`."""
    if limit is None:
        return None
    if not isinstance(limit, int) or isinstance(limit, bool):
        raise TypeError(f'limit must be an int or None, not {type(limit).__name__}')
    if limit < 1:
        raise ValueError(f'limit must be at least 1, not {limit}')
    return limit
