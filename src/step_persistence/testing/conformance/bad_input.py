"""Bad input: records refuse naive datetimes and unknown literal values; stores refuse ids that are not strings."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any

import pytest

from step_persistence.protocol import StepStore
from step_persistence.records import ContinuableSnapshot, RunRecord, StepEvent
from step_persistence.testing.conformance.shared import ConformanceBase, _effect

NOT_TEXT: tuple[object, ...] = ({'$ne': None}, {'$gt': ''}, 5, ['r'], b'r')
"""Values a caller (or a model) might pass as an id: query operators, numbers, lists, bytes."""


def _id_reads(store: StepStore, value: Any) -> dict[str, Callable[[], Awaitable[object]]]:
    """Every read or delete of the protocol, with `value` as one of its id or filter arguments."""
    return {
        'get_run(run_id)': lambda: store.get_run(run_id=value),
        'list_runs(parent_run_id)': lambda: store.list_runs(parent_run_id=value),
        'list_runs(conversation_id)': lambda: store.list_runs(conversation_id=value),
        'list_events(run_id)': lambda: store.list_events(run_id=value),
        'latest_snapshot(run_id)': lambda: store.latest_snapshot(run_id=value),
        'list_snapshots(run_id)': lambda: store.list_snapshots(run_id=value),
        'get_tool_effect(run_id)': lambda: store.get_tool_effect(run_id=value, tool_call_id='c'),
        'get_tool_effect(tool_call_id)': lambda: store.get_tool_effect(run_id='r', tool_call_id=value),
        'list_unresolved_tool_effects(run_id)': lambda: store.list_unresolved_tool_effects(run_id=value),
        'list_tool_effects(run_id)': lambda: store.list_tool_effects(run_id=value),
        'delete_run(run_id)': lambda: store.delete_run(run_id=value),
    }


class BadInputConformance(ConformanceBase):
    """Records and stores that refuse bad input."""

    @pytest.mark.parametrize('value', NOT_TEXT, ids=repr)
    async def test_ids_and_filters_that_are_not_strings_raise_type_error(self, store: StepStore, value: object) -> None:
        await self._register(store, 'r', conversation_id='c', parent_run_id='p')
        await store.record_tool_effect(_effect('r', 'c'))
        outcomes: dict[str, str] = {}
        for call, read in _id_reads(store, value).items():
            try:
                await read()
            except TypeError as error:
                outcomes[call] = 'refused' if 'must be a string' in str(error) else repr(error)
            else:
                outcomes[call] = 'accepted'
        assert outcomes == dict.fromkeys(outcomes, 'refused')
        assert [record.run_id for record in await store.list_runs()] == ['r']
        assert await store.get_tool_effect(run_id='r', tool_call_id='c') is not None

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
