"""Agent scenarios run in a separate Python process by the capability tests.

Usage: python child.py SCENARIO SPEC_JSON. The store is rebuilt with `from_spec(**spec)`.
Prints one JSON object on stdout when the scenario finishes normally.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pydantic_ai import Agent, RunContext
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart

from step_persistence import StepPersistence, StepStore, annotate_tool_effect, continue_run, from_spec
from support.scripted import calls, scripted, text


def crashing_worker(store: StepStore) -> Agent[None, str]:
    agent = Agent(
        scripted(
            calls(('prepare', {'n': 1}, 'prepare-1')),
            calls(('charge_card', {'cents': 500}, 'charge-1')),
            text('charged'),
        ),
        capabilities=[StepPersistence(store=store, agent_name='worker')],
    )

    @agent.tool_plain
    async def prepare(n: int) -> str:
        return f'prepared {n}'

    @agent.tool
    async def charge_card(ctx: RunContext[None], cents: int) -> str:
        await annotate_tool_effect(store, ctx, idempotency_key='charge-order-7', effect_summary=f'charge {cents}')
        os._exit(17)

    return agent


def history_echo(messages: list[ModelMessage]) -> ModelResponse:
    prompts = [
        part.content
        for message in messages
        for part in getattr(message, 'parts', [])
        if part.part_kind == 'user-prompt'
    ]
    return ModelResponse(parts=[TextPart(f'seen {len(messages)} messages; prompts={prompts}')])


def librarian(store: StepStore) -> Agent[None, str]:
    agent = Agent(
        scripted(calls(('search', {'symbol': 'ThinkingPartDelta'}, 'search-1')), history_echo),
        capabilities=[StepPersistence(store=store, agent_name='librarian')],
    )

    @agent.tool_plain
    async def search(symbol: str) -> str:
        return f'{symbol} is defined in messages.py'

    return agent


def orchestrator(store: StepStore, delegate: Agent[None, str]) -> Agent[None, str]:
    agent = Agent(
        scripted(calls(('ask_librarian', {'question': 'Where is ThinkingPartDelta?'}, 'ask-1')), text('done')),
        capabilities=[StepPersistence(store=store, agent_name='orchestrator')],
    )

    @agent.tool_plain
    async def ask_librarian(question: str) -> str:
        return (await delegate.run(question, conversation_id='libr-conv')).output

    return agent


async def main(scenario: str, spec: dict[str, Any]) -> dict[str, Any]:
    store = from_spec(**spec)
    async with store:
        if scenario == 'crash':
            await crashing_worker(store).run('charge the card')
            return {'error': 'the worker should have crashed'}
        if scenario == 'delegate':
            await orchestrator(store, librarian(store)).run('investigate', conversation_id='orch-conv')
            [orch] = await store.list_runs(conversation_id='orch-conv')
            return {'orchestrator_run_id': orch.run_id}
        if scenario == 'continue_delegate':
            [orch] = await store.list_runs(conversation_id='orch-conv')
            delegate_run = (await store.list_runs(parent_run_id=orch.run_id))[-1]
            history = await continue_run(store, run_id=delegate_run.run_id)
            result = await librarian(store).run(
                'Read _apply_provider_details_delta', message_history=history, conversation_id='libr-conv'
            )
            return {'output': result.output, 'continued_from': delegate_run.run_id, 'history_length': len(history)}
    raise SystemExit(f'unknown scenario {scenario!r}')


if __name__ == '__main__':
    print(json.dumps(asyncio.run(main(sys.argv[1], json.loads(sys.argv[2])))))
