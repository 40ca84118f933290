"""Durable, inspectable step-by-step persistence for pydantic-ai agent runs."""

from step_persistence.capability import SnapshotSaved, StepPersistence
from step_persistence.helpers import (
    RecoveryReport,
    annotate_tool_effect,
    continue_run,
    fork_run,
    inspect_recovery,
    is_provider_valid,
)
from step_persistence.protocol import StepStore
from step_persistence.records import (
    ContinuableSnapshot,
    EventKind,
    RunRecord,
    SnapshotState,
    StepEvent,
    ToolEffectRecord,
    ToolEffectStatus,
)
from step_persistence.spec import from_spec
from step_persistence.stores.file import FileStepStore
from step_persistence.stores.memory import InMemoryStepStore
from step_persistence.stores.sql import PostgresStepStore, SqliteStepStore, SqlStepStore

__all__ = [
    'ContinuableSnapshot',
    'EventKind',
    'FileStepStore',
    'InMemoryStepStore',
    'PostgresStepStore',
    'RecoveryReport',
    'RunRecord',
    'SnapshotSaved',
    'SnapshotState',
    'SqlStepStore',
    'SqliteStepStore',
    'StepEvent',
    'StepPersistence',
    'StepStore',
    'ToolEffectRecord',
    'ToolEffectStatus',
    'annotate_tool_effect',
    'continue_run',
    'fork_run',
    'from_spec',
    'inspect_recovery',
    'is_provider_valid',
]
