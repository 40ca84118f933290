"""Run status and delegation trees, derived from what runs persisted."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from step_persistence import RunRecord, StepEvent, ToolEffectRecord
from step_persistence.status import load_run_tree, run_status
from support.backends import StoreMaker

pytestmark = pytest.mark.anyio
NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)


def event(kind: str, minutes_ago: float = 0) -> StepEvent:
    return StepEvent.model_validate(
        {'run_id': 'r', 'kind': kind, 'step_index': 0, 'timestamp': NOW - timedelta(minutes=minutes_ago)}
    )


UNRESOLVED = [ToolEffectRecord(run_id='r', tool_call_id='t', tool_name='mail', status='started')]


@pytest.mark.parametrize(
    ('kinds', 'unresolved', 'minutes_ago', 'expected'),
    [
        (['run_started', 'run_completed'], [], 0, 'completed'),
        (['run_started', 'run_failed'], [], 0, 'failed'),
        (['run_started', 'run_completed'], UNRESOLVED, 0, 'completed'),
        (['run_started', 'tool_call_started'], UNRESOLVED, 0, 'crashed'),
        (['run_started', 'model_request_started'], [], 1, 'running'),
        (['run_started', 'model_request_started'], [], 31, 'crashed'),
        ([], [], 0, 'running'),
    ],
)
def test_run_status(kinds: list[str], unresolved: list[ToolEffectRecord], minutes_ago: float, expected: str) -> None:
    events = [event(kind, minutes_ago) for kind in kinds]
    assert run_status(events, unresolved, now=NOW) == expected


async def test_run_tree_follows_parent_links(make_store: StoreMaker) -> None:
    store = await make_store()
    for run_id, parent, offset in [('root', None, 0), ('a', 'root', 1), ('b', 'root', 2), ('a1', 'a', 3)]:
        await store.register_run(
            RunRecord(run_id=run_id, parent_run_id=parent, started_at=NOW + timedelta(seconds=offset))
        )
        await store.append_event(StepEvent(run_id=run_id, kind='run_started', step_index=0, timestamp=NOW))
    await store.append_event(StepEvent(run_id='a', kind='run_completed', step_index=1, timestamp=NOW))
    await store.record_tool_effect(ToolEffectRecord(run_id='a1', tool_call_id='t', tool_name='mail', status='started'))

    tree = await load_run_tree(store, 'root', now=NOW)
    assert tree.record.run_id == 'root' and tree.status == 'running'
    assert [(child.record.run_id, child.status) for child in tree.children] == [('a', 'completed'), ('b', 'running')]
    [grandchild] = tree.children[0].children
    assert (grandchild.record.run_id, grandchild.status) == ('a1', 'crashed')
    assert [effect.tool_name for effect in grandchild.unresolved] == ['mail']
    with pytest.raises(LookupError, match='nope'):
        await load_run_tree(store, 'nope')
