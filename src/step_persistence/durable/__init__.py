"""Durable replay: a crashed agent run resumes where it stopped, on the store it already uses (docs/durable.md).

Names are imported on first use: the journal's records and protocol import no pydantic-ai, so the
stores read and write them without it; `StepDurability` needs pydantic-ai 2.68 or newer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from step_persistence._lazy import lazy_exports

if TYPE_CHECKING:
    from step_persistence.durable.children import child_workflow_id
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
    'child_workflow_id': 'step_persistence.durable.children',
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
    'child_workflow_id',
    'journal_for',
]


__getattr__, __dir__ = lazy_exports(__name__, _MODULES, globals())
