"""`child_workflow_id`: the id of a delegate run started without one inside a tool call of a durable run."""

from __future__ import annotations

from step_persistence.durable import child_workflow_id
from step_persistence.run_ids import MAX_RUN_ID_LENGTH, validate_path_safe_run_id


def test_the_same_call_gives_the_same_id_and_others_another() -> None:
    first = child_workflow_id('order-42', 'call-1')
    assert first == child_workflow_id('order-42', 'call-1', 0)
    others = {
        child_workflow_id('order-42', 'call-1', 1),
        child_workflow_id('order-42', 'call-2'),
        child_workflow_id('order-43', 'call-1'),
    }
    assert first not in others and len(others) == 3
    assert first.startswith('order-42-')


def test_hostile_ids_give_a_path_safe_bounded_id() -> None:
    """Tool call ids come from the model, workflow ids from the caller: the child's id is still path-safe."""
    for parent, call in [('../etc', '/../../x'), ('order 42 ✓', 'call\0id'), ('p' * MAX_RUN_ID_LENGTH, 'call-1')]:
        child = child_workflow_id(parent, call)
        assert validate_path_safe_run_id(child) == child
    assert child_workflow_id('p' * MAX_RUN_ID_LENGTH, 'call-1').startswith('delegate-')
    assert child_workflow_id('p' * MAX_RUN_ID_LENGTH, 'call-1') != child_workflow_id('p' * 199, 'call-1')
