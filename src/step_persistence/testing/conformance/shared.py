"""Helpers shared by every area of the conformance suite: sample data, record builders, the base class."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar

import pytest
from pydantic_ai.messages import (
    BinaryContent,
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)

from step_persistence.protocol import StepStore
from step_persistence.records import ContinuableSnapshot, RunRecord, SnapshotState, ToolEffectRecord

__all__ = ['T0', 'ConformanceBase', 'StoreFactory', 'sample_history']

StoreFactory = Callable[..., Awaitable[StepStore]]
"""`await make_store(**options)` returns a new, empty store; options include `max_snapshots_per_run`."""

T0 = datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)


def sample_history(turns: int = 1, *, tag: str = '') -> list[ModelMessage]:
    """A realistic history: a prompt, then `turns` tool cycles with text, binary and structured returns."""
    messages: list[ModelMessage] = [ModelRequest(parts=[UserPromptPart(content=f'start {tag} ✓', timestamp=T0)])]
    for turn in range(turns):
        call_id = f'call-{tag}-{turn}'
        messages.append(
            ModelResponse(
                parts=[TextPart(content=f'thinking {turn}'), ToolCallPart('lookup', {'n': turn}, call_id)],
                timestamp=T0 + timedelta(seconds=turn),
            )
        )
        messages.append(
            ModelRequest(
                parts=[
                    ToolReturnPart(
                        'lookup',
                        {
                            'turn': turn,
                            'items': [1, 2.5, None, 'x'],
                            'image': BinaryContent(data=b'\x00\xff' * 8, media_type='image/png'),
                        }
                        if turn % 2
                        else f'result {turn}',
                        call_id,
                        timestamp=T0 + timedelta(seconds=turn),
                    )
                ]
            )
        )
    return messages


def _dump(messages: list[ModelMessage]) -> Any:
    return ModelMessagesTypeAdapter.dump_python(messages, mode='json')


def _snapshot(
    run_id: str,
    step_index: int,
    *,
    state: SnapshotState = 'complete',
    key: str | None = None,
    messages: list[ModelMessage] | None = None,
) -> ContinuableSnapshot:
    return ContinuableSnapshot(
        run_id=run_id,
        step_index=step_index,
        messages=sample_history(step_index, tag=run_id) if messages is None else messages,
        state=state,
        idempotency_key=key,
        conversation_id='conv',
        parent_run_id='parent',
        agent_name='agent',
    )


def _seqs(snapshots: list[ContinuableSnapshot]) -> list[int]:
    seqs = [snapshot.seq for snapshot in snapshots]
    assert all(seq is not None for seq in seqs), 'stores set seq on every snapshot they return'
    return [seq for seq in seqs if seq is not None]


def _effect(run_id: str, call_id: str, status: str = 'started', **fields: Any) -> ToolEffectRecord:
    return ToolEffectRecord.model_validate(
        {'run_id': run_id, 'tool_call_id': call_id, 'tool_name': 'send_mail', 'status': status, **fields}
    )


class ConformanceBase:
    """What every area of the suite shares: the anyio mark, declared divergences, the `store` fixture."""

    pytestmark = pytest.mark.anyio
    divergences: ClassVar[Mapping[str, str]] = {}
    """Known divergences of the backend under test: test name -> reason. They run as strict xfails."""

    @pytest.fixture
    def anyio_backend(self) -> str:
        return 'asyncio'

    @pytest.fixture(autouse=True)
    def _declared_divergence(self, request: pytest.FixtureRequest) -> None:
        reason = self.divergences.get(request.node.originalname)
        if reason is not None:
            request.node.add_marker(pytest.mark.xfail(strict=True, reason=reason))

    @pytest.fixture
    async def store(self, make_store: StoreFactory) -> StepStore:
        return await make_store()

    @staticmethod
    async def _register(store: StepStore, run_id: str, **fields: Any) -> RunRecord:
        record = RunRecord(run_id=run_id, **fields)
        await store.register_run(record)
        return record
