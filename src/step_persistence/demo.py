"""The main job, end to end, with scripted models and no API key.

An orchestrator delegates an investigation to a `code_librarian` sub-agent. The librarian searches
(a completed tool call), then starts writing a report and its process dies mid-tool. A second
process opens the store, prints the run tree with the unresolved side effect, and continues the
librarian from its latest complete snapshot.

Run with `python -m step_persistence.demo [--store URL]` (default: `$STEP_PERSISTENCE_STORE`, else
`sqlite:///runs.db`).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
from collections.abc import Sequence

from pydantic_ai import Agent, RunContext
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, TextPart, ToolCallPart, UserPromptPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from step_persistence.capability import StepPersistence
from step_persistence.helpers import annotate_tool_effect, continue_run, inspect_recovery
from step_persistence.protocol import StepStore
from step_persistence.spec import from_spec
from step_persistence.status import RunNode, load_run_tree

DEFAULT_STORE = 'sqlite:///runs.db'
CRASH_EXIT_CODE = 17
CONVERSATION = 'demo-orchestrator'


def _turn(messages: Sequence[ModelMessage]) -> int:
    """How many responses the model gave since the latest user prompt."""
    prompts = [
        i
        for i, m in enumerate(messages)
        if isinstance(m, ModelRequest) and any(isinstance(p, UserPromptPart) for p in m.parts)
    ]
    start = prompts[-1] if prompts else 0
    return sum(isinstance(m, ModelResponse) for m in messages[start:])


def _librarian_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    turn = _turn(messages)
    resumed = any(isinstance(m, ModelResponse) for m in messages[:-1]) and turn == 0
    if resumed:
        answer = 'Resumed from the snapshot: ThinkingPartDelta lives in messages.py; the report is still to write.'
        return ModelResponse(parts=[TextPart(answer)])
    if turn == 0:
        return ModelResponse(parts=[ToolCallPart('search', {'symbol': 'ThinkingPartDelta'}, 'search-1')])
    return ModelResponse(parts=[ToolCallPart('write_report', {'path': 'report.md'}, 'report-1')])


def _orchestrator_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    if _turn(messages) == 0:
        question = {'question': 'Where is ThinkingPartDelta?'}
        return ModelResponse(parts=[ToolCallPart('ask_librarian', question, 'ask-1')])
    return ModelResponse(parts=[TextPart('The librarian answered.')])


def build_librarian(store: StepStore) -> Agent[None, str]:
    """The sub-agent: a search, then a report whose write crashes the process."""
    librarian = Agent(
        FunctionModel(_librarian_model),
        name='code_librarian',
        capabilities=[StepPersistence[None](store=store, agent_name='code_librarian')],
    )

    @librarian.tool_plain
    async def search(symbol: str) -> str:
        return f'{symbol} is defined in pydantic_ai/messages.py'

    @librarian.tool
    async def write_report(ctx: RunContext[None], path: str) -> str:
        await annotate_tool_effect(store, ctx, idempotency_key=f'report::{path}', effect_summary=f'write {path}')
        os._exit(CRASH_EXIT_CODE)

    return librarian


def build_orchestrator(store: StepStore, librarian: Agent[None, str]) -> Agent[None, str]:
    orchestrator = Agent(
        FunctionModel(_orchestrator_model),
        name='orchestrator',
        capabilities=[StepPersistence(store=store, agent_name='orchestrator')],
    )

    @orchestrator.tool_plain
    async def ask_librarian(question: str) -> str:
        return (await librarian.run(question)).output

    return orchestrator


async def _crash_phase(store_url: str) -> None:
    async with from_spec(store_url) as store:
        await build_orchestrator(store, build_librarian(store)).run('Investigate', conversation_id=CONVERSATION)


def _print_tree(node: RunNode, depth: int = 0) -> None:
    record = node.record
    print(f'{"    " * depth}{record.agent_name or "?"}  {record.run_id}  [{node.status}]')
    for effect in node.unresolved:
        known = [
            f'{label} {value!r}'
            for label, value in (('idempotency key', effect.idempotency_key), ('summary', effect.effect_summary))
            if value is not None
        ]
        print(
            f'{"    " * depth}  ! unresolved {effect.tool_name} ({effect.tool_call_id}): may or may not have run;'
            f' {", ".join(known) if known else "no idempotency key or summary was recorded"}'
        )
    for child in node.children:
        _print_tree(child, depth + 1)


async def _inspect_and_continue(store_url: str) -> None:
    async with from_spec(store_url) as store:
        orchestrator_run = (await store.list_runs(conversation_id=CONVERSATION))[-1]
        print('Run tree:')
        _print_tree(await load_run_tree(store, orchestrator_run.run_id))
        delegate = (await store.list_runs(parent_run_id=orchestrator_run.run_id))[-1]
        report = await inspect_recovery(store=store, run_id=delegate.run_id)
        print(f'\nRecovery of {delegate.run_id}:')
        print(f'  completed tools: {report.completed_tools}')
        print(f'  unresolved: {[effect.tool_name for effect in report.unresolved_effects]}')
        history = await continue_run(store, run_id=delegate.run_id)
        print(f'  continuing from the latest complete snapshot ({len(history)} messages)')
        result = await build_librarian(store).run(
            'The report write was interrupted. Summarise what you found.', message_history=history
        )
        print(f'\nContinued run answered: {result.output}')


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    default = os.environ.get('STEP_PERSISTENCE_STORE', DEFAULT_STORE)
    parser.add_argument(
        '--store', default=default, help=f'store URL (default: $STEP_PERSISTENCE_STORE or {DEFAULT_STORE})'
    )
    parser.add_argument('--crash-phase', action='store_true', help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.crash_phase:
        asyncio.run(_crash_phase(args.store))
        return
    print(f'Running the orchestrator in a child process; its sub-agent crashes mid-tool (store: {args.store})')
    # pydantic-ai shows its first-run banner once per process: the parent's continuation shows it,
    # the crashing child (a second process of the same demo) does not repeat it.
    child = subprocess.run(
        [sys.executable, '-m', 'step_persistence.demo', '--crash-phase', '--store', args.store],
        env={**os.environ, 'PYDANTIC_AI_NO_BANNER': '1'},
    )
    if child.returncode != CRASH_EXIT_CODE:
        raise SystemExit(f'the crashing child exited with {child.returncode}, expected {CRASH_EXIT_CODE}')
    print(f'Child process died with exit code {child.returncode}.\n')
    asyncio.run(_inspect_and_continue(args.store))


if __name__ == '__main__':
    main()
