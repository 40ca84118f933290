"""Durable, inspectable step-by-step persistence for pydantic-ai agent runs.

Names are imported on first use, so `import step_persistence` stays cheap (the command line and
subprocesses start fast) and optional drivers are only needed by the stores that use them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from step_persistence._lazy import lazy_exports

if TYPE_CHECKING:
    from step_persistence.capability import SnapshotSaved, StepPersistence
    from step_persistence.conversations import continue_conversation, delete_conversation
    from step_persistence.copying import CopyReport, RunCopy, copy_runs
    from step_persistence.effects import find_tool_effects, resolve_tool_effect
    from step_persistence.errors import ErrorKind, classify_error
    from step_persistence.helpers import (
        RecoveryReport,
        annotate_tool_effect,
        continue_run,
        fork_run,
        inspect_recovery,
        is_provider_valid,
    )
    from step_persistence.protocol import StepStore
    from step_persistence.reclaiming import MediaCollection
    from step_persistence.records import (
        ContinuableSnapshot,
        EventKind,
        RunRecord,
        RunStatus,
        SnapshotState,
        StepEvent,
        TokenUsage,
        ToolEffectRecord,
        ToolEffectStatus,
    )
    from step_persistence.spec import from_spec
    from step_persistence.stores.file import FileStepStore
    from step_persistence.stores.memory import InMemoryStepStore
    from step_persistence.stores.mongo import MongoStepStore
    from step_persistence.stores.sql import PostgresStepStore, SqliteStepStore, SqlStepStore

_MODULES: dict[str, str] = {
    'SnapshotSaved': 'step_persistence.capability',
    'StepPersistence': 'step_persistence.capability',
    'MediaCollection': 'step_persistence.reclaiming',
    'CopyReport': 'step_persistence.copying',
    'RunCopy': 'step_persistence.copying',
    'copy_runs': 'step_persistence.copying',
    'continue_conversation': 'step_persistence.conversations',
    'delete_conversation': 'step_persistence.conversations',
    'find_tool_effects': 'step_persistence.effects',
    'resolve_tool_effect': 'step_persistence.effects',
    'ErrorKind': 'step_persistence.errors',
    'classify_error': 'step_persistence.errors',
    'RecoveryReport': 'step_persistence.helpers',
    'annotate_tool_effect': 'step_persistence.helpers',
    'continue_run': 'step_persistence.helpers',
    'fork_run': 'step_persistence.helpers',
    'inspect_recovery': 'step_persistence.helpers',
    'is_provider_valid': 'step_persistence.helpers',
    'StepStore': 'step_persistence.protocol',
    'ContinuableSnapshot': 'step_persistence.records',
    'EventKind': 'step_persistence.records',
    'RunRecord': 'step_persistence.records',
    'RunStatus': 'step_persistence.records',
    'SnapshotState': 'step_persistence.records',
    'StepEvent': 'step_persistence.records',
    'TokenUsage': 'step_persistence.records',
    'ToolEffectRecord': 'step_persistence.records',
    'ToolEffectStatus': 'step_persistence.records',
    'from_spec': 'step_persistence.spec',
    'FileStepStore': 'step_persistence.stores.file',
    'InMemoryStepStore': 'step_persistence.stores.memory',
    'MongoStepStore': 'step_persistence.stores.mongo',
    'PostgresStepStore': 'step_persistence.stores.sql',
    'SqliteStepStore': 'step_persistence.stores.sql',
    'SqlStepStore': 'step_persistence.stores.sql',
}

_COMPLETED_ON_IMPORT = frozenset({'ContinuableSnapshot'})
"""Models completed when imported from here, so they can be used at once as fields of other models
(`step_persistence.records` leaves that to their first use, which imports pydantic-ai)."""

__all__ = [
    'ContinuableSnapshot',
    'CopyReport',
    'ErrorKind',
    'EventKind',
    'FileStepStore',
    'InMemoryStepStore',
    'MediaCollection',
    'MongoStepStore',
    'PostgresStepStore',
    'RecoveryReport',
    'RunCopy',
    'RunRecord',
    'RunStatus',
    'SnapshotSaved',
    'SnapshotState',
    'SqlStepStore',
    'SqliteStepStore',
    'StepEvent',
    'StepPersistence',
    'StepStore',
    'TokenUsage',
    'ToolEffectRecord',
    'ToolEffectStatus',
    'annotate_tool_effect',
    'classify_error',
    'continue_conversation',
    'continue_run',
    'copy_runs',
    'delete_conversation',
    'find_tool_effects',
    'fork_run',
    'from_spec',
    'inspect_recovery',
    'is_provider_valid',
    'resolve_tool_effect',
]


def _complete(name: str, value: Any) -> None:
    if name in _COMPLETED_ON_IMPORT:
        value.model_rebuild()


__getattr__, __dir__ = lazy_exports(__name__, _MODULES, globals(), prepare=_complete)
