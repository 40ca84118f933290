"""StepPersistence across processes: a crash mid-tool, and a delegate continued elsewhere."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic_ai import Agent

from step_persistence import continue_run, from_spec, inspect_recovery, is_provider_valid
from support.backends import BackendSession, spec_of
from support.console_script import python_script
from support.scripted import scripted, text

pytestmark = pytest.mark.anyio
CHILD = Path(__file__).resolve().parents[1] / 'support' / 'child.py'


def run_child(scenario: str, spec: dict[str, Any], *, expect_exit: int = 0) -> dict[str, Any]:
    completed = python_script(CHILD, scenario, json.dumps(spec))
    assert completed.returncode == expect_exit, completed.stderr
    return json.loads(completed.stdout) if expect_exit == 0 else {}


async def test_crash_mid_tool_leaves_exactly_that_call_unresolved(durable_session: BackendSession) -> None:
    spec = spec_of(durable_session)
    run_child('crash', spec, expect_exit=17)

    async with from_spec(**spec) as store:
        [run] = await store.list_runs()
        report = await inspect_recovery(store=store, run_id=run.run_id)
        assert [(e.tool_call_id, e.tool_name, e.status) for e in report.unresolved_effects] == [
            ('charge-1', 'charge_card', 'started')
        ]
        unresolved = report.unresolved_effects[0]
        assert (unresolved.idempotency_key, unresolved.effect_summary) == ('charge-order-7', 'charge 500')
        assert report.completed_tools == ['prepare']
        events = await store.list_events(run_id=run.run_id)
        assert events[-1].kind == 'tool_call_started'
        assert not any(event.kind in ('run_completed', 'run_failed') for event in events)

        snapshot = report.latest_complete_snapshot
        assert snapshot is not None and snapshot.step_index == 1 and len(snapshot.messages) == 3
        assert report.latest_snapshot == snapshot
        history = await continue_run(store, run_id=run.run_id)
        assert is_provider_valid(history)
        resumed = await Agent(scripted(text('resumed safely'))).run('continue', message_history=history)
        assert resumed.output == 'resumed safely'
        assert len(resumed.all_messages()) == len(history) + 2


async def test_delegate_continued_in_another_process(durable_session: BackendSession) -> None:
    spec = spec_of(durable_session)
    first = run_child('delegate', spec)
    second = run_child('continue_delegate', spec)

    async with from_spec(**spec) as store:
        delegates = await store.list_runs(parent_run_id=first['orchestrator_run_id'])
        assert [run.run_id for run in delegates] == [second['continued_from']]
        # 4 restored messages, the new prompt, then the librarian searches again before answering.
        assert second['history_length'] == 4
        assert (
            "seen 7 messages; prompts=['Where is ThinkingPartDelta?', 'Read _apply_provider_details_delta']"
            in (second['output'])
        )
        librarian_runs = await store.list_runs(conversation_id='libr-conv')
        assert len(librarian_runs) == 2
        assert librarian_runs[1].parent_run_id is None
        continued = await store.latest_snapshot(run_id=librarian_runs[1].run_id)
        original = await store.latest_snapshot(run_id=librarian_runs[0].run_id)
        assert continued is not None and original is not None
        assert continued.messages[: len(original.messages)] == original.messages
