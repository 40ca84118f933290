"""One conformance suite for every `StepStore` backend (see `step_persistence.testing` for use).

Each area lives in its own module as a mixin; `StepStoreConformance` composes them all, so a
store subclasses one class and runs the whole suite.
"""

from __future__ import annotations

from step_persistence.testing.conformance.bad_input import BadInputConformance
from step_persistence.testing.conformance.batches import BatchesConformance
from step_persistence.testing.conformance.conversations import ConversationsConformance
from step_persistence.testing.conformance.events import EventsConformance
from step_persistence.testing.conformance.ledger import LedgerConformance
from step_persistence.testing.conformance.lifecycle import LifecycleConformance
from step_persistence.testing.conformance.runs import RunsConformance
from step_persistence.testing.conformance.shared import T0, ConformanceBase, StoreFactory, sample_history
from step_persistence.testing.conformance.snapshots import SnapshotsConformance

__all__ = [
    'T0',
    'BadInputConformance',
    'BatchesConformance',
    'ConformanceBase',
    'ConversationsConformance',
    'EventsConformance',
    'LedgerConformance',
    'LifecycleConformance',
    'RunsConformance',
    'SnapshotsConformance',
    'StepStoreConformance',
    'StoreFactory',
    'sample_history',
]


class StepStoreConformance(
    # pytest collects inherited tests base class first (reverse MRO), so the areas are listed
    # last first: the suite runs runs, events, snapshots, ledger, batches, lifecycle, conversations,
    # bad input.
    BadInputConformance,
    ConversationsConformance,
    LifecycleConformance,
    BatchesConformance,
    LedgerConformance,
    SnapshotsConformance,
    EventsConformance,
    RunsConformance,
):
    """Behaviour every `StepStore` must have. Subclasses provide the `make_store` fixture."""
