"""`step-persistence recover`: resume the durable workflows whose lease expired (their process died)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable
from importlib import import_module
from typing import TYPE_CHECKING, Annotated, Any

import typer

from step_persistence._urls import redact_text
from step_persistence.cli._common import (
    DEFAULT_STORE,
    EXIT_FAILED,
    EXIT_USAGE,
    JsonOption,
    StoreOption,
    UsageError,
    escape,
    fail,
    open_store,
    out,
    print_json,
    run,
    warn,
)

if TYPE_CHECKING:
    from pydantic_ai.agent.abstract import AbstractAgent

    from step_persistence.durable.records import WorkflowRecord
    from step_persistence.durable.recovery import Recovery
    from step_persistence.protocol import StepStore

__all__ = ['recover']


def _import_attribute(spec: str, option: str = '--agents') -> Any:
    """The object `module:attr` (`attr` may be dotted) names; `UsageError` saying what is missing."""
    module_name, colon, attribute = spec.partition(':')
    if not colon or not module_name or not attribute:
        raise UsageError(f'{option} {spec!r} must be MODULE:ATTRIBUTE (for example myapp.agents:build_agents)')
    if os.getcwd() not in sys.path:  # as `python -m` would: the application's modules are found from here
        sys.path.insert(0, os.getcwd())
    try:
        value: Any = import_module(module_name)
    except ImportError as error:
        raise UsageError(f'{option} {spec!r}: cannot import {module_name!r}: {error}') from error
    for name in attribute.split('.'):
        try:
            value = getattr(value, name)
        except AttributeError:
            raise UsageError(f'{option} {spec!r}: {module_name!r} has no attribute {attribute!r}') from None
    return value


def _agents_of(spec: str, value: Any, store: StepStore) -> list[AbstractAgent[Any, Any]]:
    """The agents `value` (what `spec` names) is: an agent, an iterable of agents, or a callable given the store
    returning either."""
    from pydantic_ai.agent.abstract import AbstractAgent

    if callable(value) and not isinstance(value, AbstractAgent):
        value = value(store)
    found: Iterable[Any] = [value] if isinstance(value, AbstractAgent) else value
    try:
        agents = list(found)
    except TypeError:
        raise UsageError(f'--agents {spec!r} is a {type(value).__name__}, not an agent or agents') from None
    for agent in agents:
        if not isinstance(agent, AbstractAgent):
            raise UsageError(f'--agents {spec!r} holds a {type(agent).__name__}, not an agent')
    return agents


def _workflow_json(record: WorkflowRecord) -> dict[str, Any]:
    return {
        'workflow_id': record.workflow_id,
        'agent_name': record.agent_name,
        'owner': record.owner,
        'lease_expires_at': record.lease_expires_at,
        'attempts': record.attempts,
    }


def _recovery_json(recovery: Recovery) -> dict[str, Any]:
    output = recovery.output
    shown = output if output is None or isinstance(output, (str, int, float, bool)) else repr(output)
    return {
        'workflow_id': recovery.workflow_id,
        'agent_name': recovery.agent_name,
        'outcome': recovery.outcome,
        'detail': None if recovery.detail is None else redact_text(recovery.detail),
        'output': shown,
    }


def recover(
    store: StoreOption = DEFAULT_STORE,
    agents: Annotated[
        list[str] | None,
        typer.Option(
            '--agents',
            metavar='MODULE:ATTRIBUTE',
            help=(
                'The agents that run the workflows (matched by name): an agent, a list of agents, or a function '
                'given the opened store and returning them (so that they journal in it). Repeat for several.'
            ),
            show_default=False,
        ),
    ] = None,
    deps: Annotated[
        str | None,
        typer.Option(
            '--deps',
            metavar='MODULE:ATTRIBUTE',
            help=(
                "A function given a workflow's record (WorkflowRecord) and returning the deps its run is given "
                '(awaited if it returns an awaitable). Without it, runs get no deps.'
            ),
            show_default=False,
        ),
    ] = None,
    dry_run: Annotated[
        bool, typer.Option('--dry-run', help='Only list the abandoned workflows; claim and run nothing.')
    ] = False,
    json_output: JsonOption = False,
) -> None:
    """Resume the durable workflows whose run stopped holding its lease (its process died), oldest first.

    Each is claimed (atomically: of several processes recovering at once, one resumes it) and run to its
    end by the agent named as the one that ran it, with its recorded prompt, initial message history and
    deferred tool results (and the deps --deps makes for it): completed units replay, the rest run. Exit 1
    if a resumed run failed; a workflow no agent given can run is skipped, with a warning. --dry-run reads only.
    """
    if not agents and not dry_run:
        fail('give the agents that run the workflows: --agents MODULE:ATTRIBUTE (or --dry-run)', EXIT_USAGE)
    try:  # before the store is opened: a mistake in them is a usage error, whatever the store
        named = {spec: _import_attribute(spec) for spec in agents or ()} if not dry_run else {}
        deps_for = None if deps is None or dry_run else _import_attribute(deps, '--deps')
        if deps_for is not None and not callable(deps_for):
            raise UsageError(f'--deps {deps!r} is a {type(deps_for).__name__}, not a function')
    except UsageError as error:
        fail(str(error), EXIT_USAGE)

    async def list_only() -> list[WorkflowRecord]:
        from step_persistence.durable.journals import journal_for
        from step_persistence.records import utc_now

        async with open_store(store) as opened:
            return await journal_for(opened).list_abandoned(now=utc_now())

    async def recover_all() -> list[Recovery]:
        from step_persistence.durable.recovery import recover_abandoned

        async with open_store(store) as opened:
            given = [agent for spec, value in named.items() for agent in _agents_of(spec, value, opened)]
            try:
                return await recover_abandoned(opened, agents=given, deps=deps_for)
            except (TypeError, ValueError) as error:
                raise UsageError(str(error)) from error

    if dry_run:
        abandoned = run(list_only)
        if json_output:
            print_json({'dry_run': True, 'workflows': [_workflow_json(record) for record in abandoned]})
            return
        out().print(f'{len(abandoned)} abandoned workflow(s)', highlight=False)
        for record in abandoned:
            agent = escape(record.agent_name or '?')
            out().print(f'  {escape(record.workflow_id)} (agent {agent}, {record.attempts} run(s))', highlight=False)
        return
    recoveries = run(recover_all)
    if json_output:
        print_json({'dry_run': False, 'workflows': [_recovery_json(recovery) for recovery in recoveries]})
    else:
        out().print(f'{len(recoveries)} abandoned workflow(s)', highlight=False)
        for recovery in recoveries:
            detail = f': {escape(redact_text(recovery.detail))}' if recovery.detail else ''
            out().print(f'  {escape(recovery.workflow_id)} {recovery.outcome}{detail}', highlight=False)
    for recovery in recoveries:
        if recovery.outcome == 'skipped':
            warn(f'workflow {recovery.workflow_id!r} skipped: {redact_text(recovery.detail or "")}')
    if any(recovery.outcome == 'failed' for recovery in recoveries):
        raise typer.Exit(EXIT_FAILED)
