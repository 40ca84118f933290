"""A store holding every kind of run the reporting figures tell apart, written by real agents.

- `orchestrator-run` (completed) delegates to a researcher, which delegates to a librarian:
  a three-level tree by `parent_run_id`;
- a mailer run that fails (its tool raises) after a tool call that asked for a retry once, with
  parallel calls and frontier snapshots, so it ends on an `interrupted` snapshot;
- a worker that crashes mid-tool in another process (`tests/support/child.py crash`), leaving
  an unresolved ledger record;
- a run whose last event is two hours old (crashed: stale), one that has just started
  (running), and one registered without any event (running).

The in-process agents write through a store keeping at most three snapshots per run.
"""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import anyio.to_thread
import pytest
from pydantic_ai import Agent, ModelRetry

from step_persistence import RunRecord, StepEvent, StepPersistence, StepStore, from_spec
from step_persistence.records import utc_now
from support.console_script import python_script
from support.scripted import calls, scripted, text

__all__ = ['ORCHESTRATOR_RUN', 'populate']

ORCHESTRATOR_RUN = 'orchestrator-run'
CHILD = Path(__file__).with_name('child.py')


def _delegation(store: StepStore) -> Agent[None, str]:
    librarian = Agent(
        scripted(calls(('search', {'symbol': 'ThinkingPartDelta'}, 'search-1')), text('in messages.py')),
        capabilities=[StepPersistence(store=store, agent_name='librarian')],
    )

    @librarian.tool_plain
    async def search(symbol: str) -> str:
        return f'{symbol} is defined in messages.py'

    researcher = Agent(
        scripted(calls(('ask_librarian', {'question': 'where?'}, 'ask-1')), text('found it')),
        capabilities=[StepPersistence(store=store, agent_name='researcher')],
    )

    @researcher.tool_plain
    async def ask_librarian(question: str) -> str:
        return (await librarian.run(question)).output

    orchestrator = Agent(
        scripted(
            calls(('plan', {'goal': 'docs'}, 'plan-1'), ('ask_researcher', {'topic': 'deltas'}, 'research-1')),
            text('done'),
        ),
        capabilities=[StepPersistence(store=store, agent_name='orchestrator', run_id=ORCHESTRATOR_RUN)],
    )

    @orchestrator.tool_plain
    async def plan(goal: str) -> str:
        return f'plan for {goal}'

    @orchestrator.tool_plain
    async def ask_researcher(topic: str) -> str:
        return (await researcher.run(topic)).output

    return orchestrator


def _failing_mailer(store: StepStore) -> Agent[None, str]:
    agent = Agent(
        scripted(
            calls(('lookup', {'name': 'ada'}, 'lookup-1')),
            calls(('lookup', {'name': 'ada lovelace'}, 'lookup-2'), ('search', {'symbol': 'ada'}, 'search-2')),
            calls(('send_mail', {'to': 'ada@example.com'}, 'mail-1')),
            text('unreachable'),
        ),
        capabilities=[StepPersistence(store=store, agent_name='mailer', capture_frontier=True)],
    )

    @agent.tool_plain
    async def lookup(name: str) -> str:
        if ' ' not in name:
            raise ModelRetry('give the full name')
        return f'{name} <ada@example.com>'

    @agent.tool_plain
    async def search(symbol: str) -> str:
        return f'{symbol}: nothing found'

    @agent.tool_plain
    async def send_mail(to: str) -> str:
        raise RuntimeError(f'SMTP refused {to}')

    return agent


async def _crash_in_another_process(spec: dict[str, Any]) -> None:
    completed = await anyio.to_thread.run_sync(python_script, CHILD, 'crash', json.dumps(spec))
    assert completed.returncode == 17, completed.stderr


async def _hand_written_runs(store: StepStore) -> None:
    """Runs no agent would leave behind on purpose: a stale one, a starting one, an idle one."""
    long_ago = utc_now() - timedelta(hours=2)
    await store.register_run(RunRecord(run_id='stale-run', agent_name='worker', started_at=long_ago))
    for step, kind in enumerate(('run_started', 'model_request_started')):
        await store.append_event(StepEvent(run_id='stale-run', kind=kind, step_index=step, timestamp=long_ago))
    await store.register_run(RunRecord(run_id='starting-run', agent_name='worker', conversation_id='conv-2'))
    await store.append_event(StepEvent(run_id='starting-run', kind='run_started', step_index=0))
    await store.register_run(RunRecord(run_id='idle-run'))


async def populate(spec: dict[str, Any]) -> None:
    """Write the runs described above into the store `from_spec(**spec)` opens."""
    async with from_spec(**spec, max_snapshots_per_run=3) as store:
        await _delegation(store).run('write the docs', conversation_id='conv-1')
        with pytest.raises(RuntimeError, match='SMTP refused'):
            await _failing_mailer(store).run('mail ada', conversation_id='conv-2')
        await _crash_in_another_process(spec)
        await _hand_written_runs(store)
