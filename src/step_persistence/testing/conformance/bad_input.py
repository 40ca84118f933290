"""Bad input: records refuse naive datetimes and unknown literal values."""

from __future__ import annotations

from datetime import datetime

import pytest

from step_persistence.records import ContinuableSnapshot, RunRecord, StepEvent
from step_persistence.testing.conformance.shared import ConformanceBase, _effect


class BadInputConformance(ConformanceBase):
    """Records that refuse bad input."""

    async def test_naive_datetimes_are_rejected(self) -> None:
        naive = datetime(2026, 1, 1, 12, 0)
        with pytest.raises(ValueError, match='naive'):
            RunRecord(run_id='r', started_at=naive)
        with pytest.raises(ValueError, match='naive'):
            StepEvent(run_id='r', kind='run_started', step_index=0, timestamp=naive)
        with pytest.raises(ValueError, match='naive'):
            _effect('r', 't', ended_at=naive)

    async def test_unknown_literal_values_are_rejected(self) -> None:
        with pytest.raises(ValueError, match='exploded'):
            StepEvent.model_validate({'run_id': 'r', 'kind': 'exploded', 'step_index': 0})
        with pytest.raises(ValueError, match='maybe'):
            _effect('r', 't', 'maybe')
        with pytest.raises(ValueError, match='partial'):
            ContinuableSnapshot.model_validate({'run_id': 'r', 'step_index': 0, 'messages': [], 'state': 'partial'})
