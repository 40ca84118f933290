"""Idempotency keys within one batch of writes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

from step_persistence.records import ContinuableSnapshot, StepEvent

__all__ = ['first_per_key']

Keyed = TypeVar('Keyed', StepEvent, ContinuableSnapshot)


def first_per_key(records: Sequence[Keyed]) -> list[Keyed]:
    """`records` without those whose idempotency key an earlier one of them already has."""
    seen: set[str] = set()
    kept: list[Keyed] = []
    for record in records:
        key = record.idempotency_key
        if key is not None:
            if key in seen:
                continue
            seen.add(key)
        kept.append(record)
    return kept
