"""Hostile text in every string field of every record, on every backend: a clear error or a faithful round trip.

Ids, names, tool arguments, error texts and summaries can come from a model. For each field, each
value is either refused with `ValueError` or `TypeError` (and nothing of that write is stored) or
read back exactly; the sentinel run in the same store never changes. Long values are random
characters, which a database cannot compress away.
"""

from __future__ import annotations

import random
import string
from collections.abc import AsyncIterator, Awaitable, Callable
from itertools import count
from typing import Any

import pytest
from hypothesis import strategies as st
from pydantic_ai.messages import ModelRequest, ModelResponse, TextPart, ToolCallPart, ToolReturnPart, UserPromptPart

from step_persistence import ContinuableSnapshot, RunRecord, StepEvent, StepStore, ToolEffectRecord
from step_persistence.testing.conformance import T0
from support.backends import BACKENDS, BackendSession
from support.reliability_helpers import for_examples, write_sentinel

pytestmark = pytest.mark.anyio

BACKEND_NAMES = ['memory', 'file', 'sqlite', 'postgres', 'mongo']
_random = random.Random(16)


def _incompressible(length: int) -> str:
    return ''.join(_random.choice(string.ascii_letters + string.digits + 'äß日😀') for _ in range(length))


NASTY_TEXT = [
    '',
    ' ',
    '\x00',
    'nul\x00inside',
    '\x1b[31mred\x1b[0m',
    '[link=https://example.invalid]click[/link]',
    '[/x]',
    '<script>alert(1)</script>',
    "'; DROP TABLE runs; --",
    '{"$ne": null}',
    '$where',
    'a.b',
    'line\nbreak\r\n',
    '\ud7ff\ue000\U0010ffff',
    'ünïcødé-日本-😀',
    'x' * 70_000,
    _incompressible(5_000),
]
texts = st.one_of(st.text(max_size=40), st.sampled_from(NASTY_TEXT))


@pytest.fixture(params=BACKEND_NAMES)
async def session(request: pytest.FixtureRequest) -> AsyncIterator[BackendSession]:
    async with BACKENDS[request.param].open(request) as opened:
        yield opened


Write = Callable[[StepStore, str, str], Awaitable[Callable[[], Awaitable[bool]]]]
"""`await write(store, run_id, value)` writes a record holding `value` in one field and returns a check
that it reads back exactly; it raises `ValueError`/`TypeError` if the store refuses the value."""


async def _run_field(field: str, store: StepStore, run_id: str, value: str) -> Callable[[], Awaitable[bool]]:
    record = RunRecord(run_id=run_id, started_at=T0, **{field: value})
    await store.register_run(record)

    async def check() -> bool:
        return await store.get_run(run_id=run_id) == record

    return check


async def _event_field(field: str, store: StepStore, run_id: str, value: str) -> Callable[[], Awaitable[bool]]:
    await store.register_run(RunRecord(run_id=run_id, started_at=T0))
    event = StepEvent(run_id=run_id, kind='tool_call_failed', step_index=1, timestamp=T0, **{field: value})
    await store.append_event(event)

    async def check() -> bool:
        return await store.list_events(run_id=run_id) == [event]

    return check


async def _effect_field(field: str, store: StepStore, run_id: str, value: str) -> Callable[[], Awaitable[bool]]:
    await store.register_run(RunRecord(run_id=run_id, started_at=T0))
    fields: dict[str, Any] = {'tool_call_id': 'call', 'tool_name': 'pay', field: value}
    effect = ToolEffectRecord(run_id=run_id, status='started', started_at=T0, **fields)
    await store.record_tool_effect(effect)

    async def check() -> bool:
        found = await store.get_tool_effect(run_id=run_id, tool_call_id=effect.tool_call_id)
        return found == effect and await store.list_unresolved_tool_effects(run_id=run_id) == [effect]

    return check


async def _snapshot_field(field: str, store: StepStore, run_id: str, value: str) -> Callable[[], Awaitable[bool]]:
    await store.register_run(RunRecord(run_id=run_id, started_at=T0))
    snapshot = ContinuableSnapshot(
        run_id=run_id, step_index=1, timestamp=T0, messages=_history('plain'), **{field: value}
    )
    await store.save_snapshot(snapshot)

    async def check() -> bool:
        found = await store.latest_snapshot(run_id=run_id)
        return found is not None and getattr(found, field) == value

    return check


def _history(value: str) -> list[Any]:
    """A tool cycle whose prompt, tool name, arguments, call id, return and answer all hold `value`."""
    return [
        ModelRequest(parts=[UserPromptPart(content=value, timestamp=T0)]),
        ModelResponse(
            parts=[TextPart(content=value), ToolCallPart(value or 'tool', {value: value}, 'c1')], timestamp=T0
        ),
        ModelRequest(parts=[ToolReturnPart(value or 'tool', {'echo': value}, 'c1', timestamp=T0)]),
        ModelResponse(parts=[TextPart(content=value)], timestamp=T0),
    ]


async def _messages(store: StepStore, run_id: str, value: str) -> Callable[[], Awaitable[bool]]:
    await store.register_run(RunRecord(run_id=run_id, started_at=T0))
    messages = _history(value)
    await store.save_snapshot(ContinuableSnapshot(run_id=run_id, step_index=1, timestamp=T0, messages=messages))

    async def check() -> bool:
        found = await store.latest_snapshot(run_id=run_id)
        return found is not None and found.messages == messages

    return check


def _bound(writer: Callable[..., Awaitable[Callable[[], Awaitable[bool]]]], field: str) -> Write:
    async def write(store: StepStore, run_id: str, value: str) -> Callable[[], Awaitable[bool]]:
        return await writer(field, store, run_id, value)

    return write


FIELDS: dict[str, Write] = {
    **{f'run.{name}': _bound(_run_field, name) for name in ('conversation_id', 'parent_run_id', 'agent_name')},
    **{
        f'event.{name}': _bound(_event_field, name)
        for name in (
            'tool_call_id',
            'tool_name',
            'error',
            'idempotency_key',
            'conversation_id',
            'agent_name',
            'model_name',
        )
    },
    **{
        f'effect.{name}': _bound(_effect_field, name)
        for name in ('tool_call_id', 'tool_name', 'idempotency_key', 'effect_summary')
    },
    **{f'snapshot.{name}': _bound(_snapshot_field, name) for name in ('idempotency_key', 'agent_name')},
    'messages (prompt, tool name, arguments, return, text)': _messages,
}


@pytest.mark.parametrize('field', list(FIELDS))
async def test_hostile_text_in_a_field_is_refused_clearly_or_read_back_exactly(
    session: BackendSession, field: str
) -> None:
    store = await session.make()
    unchanged = await write_sentinel(store)
    numbers = count()
    write = FIELDS[field]

    async def check(value: str) -> None:
        run_id = f'hostile-{next(numbers)}'
        try:
            read_back = await write(store, run_id, value)
        except (ValueError, TypeError):
            stored = await store.get_run(run_id=run_id)
            if stored is not None:  # the run itself was fine; the refused write left nothing of it
                assert await store.list_events(run_id=run_id) == []
                assert await store.list_snapshots(run_id=run_id, include_interrupted=True) == []
                assert await store.list_tool_effects(run_id=run_id) == []
        else:
            assert await read_back(), f'{field} did not read back exactly'
        await store.delete_run(run_id=run_id)
        await unchanged()

    await for_examples(texts, check, always=NASTY_TEXT, max_examples=5)
