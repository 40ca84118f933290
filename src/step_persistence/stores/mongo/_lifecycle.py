"""The Mongo store's run lifecycle queries: a run's tool effects, and the runs that started before a cutoff.

Both are served by indexes of `_indexes.py`: tool effects by `run_tool_call` (`run_id` first),
prune candidates by `started_at` on `runs`.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Final

from pymongo import ASCENDING

__all__ = ['RUN_ORDER', 'TOOL_EFFECT_ORDER', 'started_before_query']

TOOL_EFFECT_ORDER: Final = [('started_at', ASCENDING), ('started_at_us', ASCENDING), ('tool_call_id', ASCENDING)]
"""Tool effects oldest `started_at` first (millisecond date, then its sub-millisecond micros), ties by call id."""

RUN_ORDER: Final = [('started_at', ASCENDING), ('started_at_us', ASCENDING), ('registration', ASCENDING)]
"""Runs oldest `started_at` first, ties in registration order (as `list_runs`)."""


def started_before_query(cutoff: datetime) -> dict[str, Any]:
    """Runs whose millisecond `started_at` is at most `cutoff`'s: every run that started before it.

    Runs in `cutoff`'s own millisecond that started at or after it match too; the caller drops
    them by their full `started_at`.
    """
    cutoff = cutoff.astimezone(UTC)
    return {'started_at': {'$lte': cutoff.replace(microsecond=cutoff.microsecond - cutoff.microsecond % 1000)}}
