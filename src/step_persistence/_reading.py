"""Reading persisted items defensively: a corrupt item is skipped and logged, never fatal to a listing."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable
from functools import partial
from typing import TypeVar

__all__ = ['logger', 'read_each', 'read_or_skip', 'read_or_skip_async']

logger = logging.getLogger('step_persistence')

S = TypeVar('S')
T = TypeVar('T')


def read_or_skip(description: str, build: Callable[[], T]) -> T | None:
    """Return `build()`, or log a warning naming `description` and return `None` if it raises."""
    try:
        return build()
    except Exception as error:
        logger.warning('skipping unreadable %s: %r', description, error)
        return None


async def read_or_skip_async(description: str, build: Callable[[], Awaitable[T]]) -> T | None:
    """`read_or_skip` for a read that awaits (restoring media from a media store, for instance)."""
    try:
        return await build()
    except Exception as error:
        logger.warning('skipping unreadable %s: %r', description, error)
        return None


def read_each(items: Iterable[S], describe: Callable[[S], str], build: Callable[[S], T | None]) -> list[T]:
    """`build(item)` of every item that can be read, in order; each one that cannot is logged (named by
    `describe(item)`) and skipped, so one damaged item never hides the others. An item `build` gives
    `None` for (one found gone, for instance) is left out without a warning."""
    built = (read_or_skip(describe(item), partial(build, item)) for item in items)
    return [value for value in built if value is not None]
