"""Checking the type of the ids and filters a store is called with, before any database sees them.

Ids can come from a model or a web request. A non-string that reached a database could mean
something else there (a MongoDB query operator such as `{'$ne': None}` matches every document),
so every store refuses it with `TypeError` first.
"""

from __future__ import annotations

__all__ = ['require_text']


def require_text(name: str, value: object, *, optional: bool = False) -> None:
    """Raise `TypeError` unless `value` is a `str` (or `None`, when `optional`); `name` is the argument."""
    if isinstance(value, str) or (optional and value is None):
        return
    expected = 'a string or None' if optional else 'a string'
    raise TypeError(f'{name} must be {expected}, not {type(value).__name__}')
