"""The agents of the durable-replay tests: a scripted model and two tools, counting every call they really make."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import pytest
from pydantic_ai import Agent, DeferredToolRequests, RunContext, Tool
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from step_persistence import StepPersistence, StepStore, annotate_tool_effect
from step_persistence.durable.engine import StepDurability
from step_persistence.durable.errors import LeaseLostError
from step_persistence.durable.journals import journal_for
from step_persistence.durable.policies import METADATA_KEY
from step_persistence.records import utc_now

AGENT_NAME = 'orders'

WAIT_LIMIT = 2000
"""Rounds of the event loop a test waits for a condition before failing."""


async def wait_until(condition: Callable[[], Any]) -> None:
    """Poll `condition` (a coroutine function) until it returns true; `AssertionError` after `WAIT_LIMIT` rounds."""
    for _ in range(WAIT_LIMIT):
        if await condition():
            return
        await asyncio.sleep(0.005)
    raise AssertionError('the condition never held')


@dataclass
class Calls:
    """What really ran: model requests and tool bodies (a replayed unit runs none of them)."""

    model: int = 0
    tools: Counter[str] = field(default_factory=Counter[str])
    hooks: dict[str, Callable[[], Any]] = field(default_factory=dict[str, Callable[[], Any]])
    """Run inside a call (after it is counted): `'model:<n>'` in the n-th model request, `'<tool>'` in a tool."""

    async def _hook(self, name: str) -> None:
        hook = self.hooks.get(name)
        if hook is not None:
            outcome = hook()
            if asyncio.iscoroutine(outcome):
                await outcome


def _returns(messages: list[ModelMessage]) -> list[str]:
    return [
        f'{part.tool_name}={part.content}'
        for message in messages
        if isinstance(message, ModelRequest)
        for part in message.parts
        if isinstance(part, ToolReturnPart)
    ]


def build_agent(
    store: StepStore,
    calls: Calls,
    *,
    record: bool = True,
    record_into: StepStore | None = None,
    instructions: str = 'Take the order.',
    idempotent_b: bool = False,
    charge_config: dict[str, Any] | None = None,
    **durability: Any,
) -> Agent[None, str | DeferredToolRequests]:
    """An agent whose first request calls `reserve` and `charge` in parallel, and whose second one answers.

    `reserve` is marked idempotent; `charge` is, with `idempotent_b`, or has `charge_config` as its durable
    configuration. With `record`, `StepPersistence` records the run in the same store (or through `record_into`,
    a wrapper of it).
    """

    async def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        calls.model += 1
        await calls._hook(f'model:{calls.model}')
        if not _returns(messages):
            return ModelResponse(
                parts=[
                    ToolCallPart('reserve', {'sku': 'A-1'}, tool_call_id='call-reserve'),
                    ToolCallPart('charge', {'cents': 1250}, tool_call_id='call-charge'),
                ]
            )
        return ModelResponse(parts=[TextPart('done: ' + ', '.join(_returns(messages)))])

    async def reserve(sku: str) -> str:
        calls.tools['reserve'] += 1
        await calls._hook('reserve')
        return f'reserved {sku}'

    async def charge(ctx: RunContext[None], cents: int) -> str:
        calls.tools['charge'] += 1
        if record:
            await annotate_tool_effect(
                store, ctx, idempotency_key=f'charge-{ctx.run_id}', effect_summary='card charged'
            )
        await calls._hook('charge')
        return f'charged {cents}'

    metadata = {'step_persistence': {'idempotent': True}}
    charge_metadata = {METADATA_KEY: charge_config} if charge_config is not None else metadata if idempotent_b else None
    tools = [Tool(reserve, metadata=metadata), Tool(charge, metadata=charge_metadata)]
    capabilities: list[Any] = [StepPersistence(record_into or store)] if record else []
    capabilities.append(StepDurability(store, **durability))
    return Agent(
        FunctionModel(model),
        name=AGENT_NAME,
        instructions=instructions,
        tools=tools,
        output_type=[str, DeferredToolRequests],
        capabilities=capabilities,
    )


DESK_NAME = 'desk'
DELEGATE_CALL = 'call-delegate'


def build_delegating_agent(
    store: StepStore, desk: Calls, orders: Calls, *, delegate_in_flight: str | None = None, **options: Any
) -> Agent[None, str | DeferredToolRequests]:
    """An agent whose tool `delegate` runs the order agent (`build_agent(store, orders, **options)`) as a
    delegate, without a `run_id`; its first request calls the tool, its second one answers with the result.

    `delegate` has the default in-flight policy (`fail`): its run is a child workflow, so a resumed parent
    runs it again and the delegate replays its own units; `delegate_in_flight` sets the tool's own policy in
    its metadata. `desk.model` counts the parent's requests. A `lease_duration` option is both agents' lease.
    """
    orders_agent = build_agent(store, orders, **options)
    lease = {key: options[key] for key in ('lease_duration',) if key in options}

    async def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        desk.model += 1
        await desk._hook(f'model:{desk.model}')
        returns = _returns(messages)
        if not returns:
            return ModelResponse(parts=[ToolCallPart('delegate', {'task': 'two items'}, tool_call_id=DELEGATE_CALL)])
        return ModelResponse(parts=[TextPart('desk: ' + ', '.join(returns))])

    async def delegate(task: str) -> str:
        desk.tools['delegate'] += 1
        result = await orders_agent.run(task)
        assert isinstance(result.output, str)
        return result.output

    return Agent(
        FunctionModel(model),
        name=DESK_NAME,
        tools=[
            Tool(
                delegate,
                metadata=None if delegate_in_flight is None else {METADATA_KEY: {'in_flight': delegate_in_flight}},
            )
        ],
        output_type=[str, DeferredToolRequests],
        capabilities=[StepPersistence(store), StepDurability(store, **lease)],
    )


@dataclass
class Shop:
    """The deps of `build_shop_agent`'s agent."""

    name: str


@dataclass
class Counted:
    """What `build_shop_agent`'s agent really ran; `charge` waits for `release` once it is set to an event."""

    model: int = 0
    charges: int = 0
    inside: asyncio.Event = field(default_factory=asyncio.Event)
    release: asyncio.Event | None = None
    seen: list[list[ModelMessage]] = field(default_factory=list[list[ModelMessage]])


def build_shop_agent(store: StepStore, counted: Counted) -> Agent[Shop, str]:
    """An agent whose request after a prompt calls `charge` (which needs `deps`), and whose next one answers."""

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        counted.model += 1
        counted.seen.append(list(messages))
        last = messages[-1]
        if isinstance(last, ModelRequest) and any(isinstance(part, ToolReturnPart) for part in last.parts):
            returned = next(part for part in last.parts if isinstance(part, ToolReturnPart))
            return ModelResponse(parts=[TextPart(f'{returned.content} after {len(messages) - 3} earlier messages')])
        return ModelResponse(parts=[ToolCallPart('charge', {'cents': 1250}, tool_call_id='call-charge')])

    async def charge(ctx: RunContext[Shop], cents: int) -> str:
        counted.charges += 1
        counted.inside.set()
        if counted.release is not None:
            await counted.release.wait()
        return f'{ctx.deps.name} charged {cents}'

    return Agent(
        FunctionModel(model),
        name='orders',
        deps_type=Shop,
        tools=[Tool(charge, metadata={'step_persistence': {'idempotent': True}})],
        capabilities=[StepPersistence(store), StepDurability(store)],
    )


async def abandon_inside_charge(store: StepStore, run: Any, counted: Counted, workflow_id: str) -> None:
    """Leave `run` (stopped inside `charge`) abandoned, as a dead process would: its lease taken by a gone owner
    whose lease expired, so the run's own writes are refused and it stops without ending the workflow."""
    counted.release = asyncio.Event()
    task = asyncio.ensure_future(run)
    await counted.inside.wait()
    now = utc_now()
    gone = await journal_for(store).claim_workflow(
        workflow_id=workflow_id, owner='gone', lease_expires_at=now - timedelta(seconds=1), now=now + timedelta(hours=1)
    )
    assert gone is not None and gone.owner == 'gone'
    counted.release.set()
    with pytest.raises(LeaseLostError):
        await task
