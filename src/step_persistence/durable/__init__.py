"""Durable replay: a crashed agent run resumes where it stopped, on the store it already uses (docs/durable.md).

Names are imported on first use: the journal's records and protocol import no pydantic-ai, so the
stores read and write them without it; `StepDurability` needs pydantic-ai 2.68 or newer.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from step_persistence.durable.engine import StepDurability
    from step_persistence.durable.errors import (
        CodeVersionMismatchError,
        DurableReplayError,
        InFlightUnitError,
        ReplayDivergedError,
    )
    from step_persistence.durable.journals import journal_for
    from step_persistence.durable.policies import InFlightPolicy
    from step_persistence.durable.protocol import JournalStore
    from step_persistence.durable.records import DurableUnit, WorkflowRecord

_MODULES: dict[str, str] = {
    'CodeVersionMismatchError': 'step_persistence.durable.errors',
    'DurableReplayError': 'step_persistence.durable.errors',
    'InFlightPolicy': 'step_persistence.durable.policies',
    'InFlightUnitError': 'step_persistence.durable.errors',
    'ReplayDivergedError': 'step_persistence.durable.errors',
    'StepDurability': 'step_persistence.durable.engine',
    'DurableUnit': 'step_persistence.durable.records',
    'JournalStore': 'step_persistence.durable.protocol',
    'WorkflowRecord': 'step_persistence.durable.records',
    'journal_for': 'step_persistence.durable.journals',
}

__all__ = [
    'CodeVersionMismatchError',
    'DurableReplayError',
    'DurableUnit',
    'InFlightPolicy',
    'InFlightUnitError',
    'JournalStore',
    'ReplayDivergedError',
    'StepDurability',
    'WorkflowRecord',
    'journal_for',
]


def __getattr__(name: str) -> Any:
    """Import a public name from its module on first use."""
    module = _MODULES.get(name)
    if module is None:
        raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_MODULES})
