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
        AskWithoutDeferredOutputError,
        CodeVersionMismatchError,
        DurableReplayError,
        InFlightUnitError,
        LeaseLostError,
        ReplayDivergedError,
        WorkflowHeldError,
    )
    from step_persistence.durable.journals import journal_for
    from step_persistence.durable.policies import InFlightPolicy
    from step_persistence.durable.protocol import JournalStore
    from step_persistence.durable.records import DurableUnit, Fence, WorkflowRecord
    from step_persistence.durable.recovery import Recovery, recover_abandoned

_MODULES: dict[str, str] = {
    'AskWithoutDeferredOutputError': 'step_persistence.durable.errors',
    'CodeVersionMismatchError': 'step_persistence.durable.errors',
    'DurableReplayError': 'step_persistence.durable.errors',
    'InFlightPolicy': 'step_persistence.durable.policies',
    'InFlightUnitError': 'step_persistence.durable.errors',
    'LeaseLostError': 'step_persistence.durable.errors',
    'WorkflowHeldError': 'step_persistence.durable.errors',
    'Fence': 'step_persistence.durable.records',
    'Recovery': 'step_persistence.durable.recovery',
    'recover_abandoned': 'step_persistence.durable.recovery',
    'ReplayDivergedError': 'step_persistence.durable.errors',
    'StepDurability': 'step_persistence.durable.engine',
    'DurableUnit': 'step_persistence.durable.records',
    'JournalStore': 'step_persistence.durable.protocol',
    'WorkflowRecord': 'step_persistence.durable.records',
    'journal_for': 'step_persistence.durable.journals',
    'child_workflow_id': 'step_persistence.durable.children',
}

__all__ = [
    'AskWithoutDeferredOutputError',
    'CodeVersionMismatchError',
    'DurableReplayError',
    'DurableUnit',
    'Fence',
    'InFlightPolicy',
    'InFlightUnitError',
    'JournalStore',
    'LeaseLostError',
    'Recovery',
    'ReplayDivergedError',
    'StepDurability',
    'WorkflowHeldError',
    'WorkflowRecord',
    'child_workflow_id',
    'journal_for',
    'recover_abandoned',
]


__getattr__, __dir__ = lazy_exports(__name__, _MODULES, globals())
