"""Reading persisted items defensively: a corrupt item is skipped and logged, never fatal to a listing."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypeVar

__all__ = ['logger', 'read_or_skip']

logger = logging.getLogger('step_persistence')

T = TypeVar('T')


def read_or_skip(description: str, build: Callable[[], T]) -> T | None:
    """Return `build()`, or log a warning naming `description` and return `None` if it raises."""
    try:
        return build()
    except Exception as error:
        logger.warning('skipping unreadable %s: %r', description, error)
        return None
