"""Durable, inspectable step-by-step persistence for pydantic-ai agent runs."""

from typing import TYPE_CHECKING, Any

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

if TYPE_CHECKING:
    from step_persistence.stores.mongo import MongoStepStore

__all__ = [
    'ContinuableSnapshot',
    'EventKind',
    'FileStepStore',
    'InMemoryStepStore',
    'MongoStepStore',
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


def __getattr__(name: str) -> Any:
    """Import `MongoStepStore` on first use, so that the package works without the MongoDB driver."""
    if name == 'MongoStepStore':
        from step_persistence.stores.mongo import MongoStepStore

        return MongoStepStore
    raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
