"""`JournalBackend`: pydantic-ai's callable operation tier, each operation run as a unit of the run's journal."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from pydantic_ai.durable_exec import (
    CapabilityOperationId,
    DurableOperationId,
    JournalCallableOperationBackend,
    ModelCompactMessagesId,
    ModelRequestId,
    RoleBasedOperationConfig,
    ToolsetCallToolId,
    ToolsetGetInstructionsId,
    ToolsetGetToolsId,
    record_durable_unit,
)
from pydantic_ai.tools import RunContext

from step_persistence.durable.fingerprints import tool_call_fingerprint
from step_persistence.durable.policies import RERUN, InFlightPolicy, UnitPolicy, tool_policy
from step_persistence.durable.records import UnitKind
from step_persistence.durable.workflow import ACTIVE_WORKFLOW, ActiveWorkflow

__all__ = ['JournalBackend']


def _run_context(cache_key: tuple[object, ...]) -> RunContext[Any] | None:
    return next((part for part in cache_key if isinstance(part, RunContext)), None)


def _operation_config(default: InFlightPolicy) -> RoleBasedOperationConfig[UnitPolicy]:
    def resolve_tool(operation_id: DurableOperationId, tool: object | None, tool_name: str) -> UnitPolicy:
        tool_def = getattr(tool, 'tool_def', None)
        metadata = getattr(tool_def, 'metadata', None)
        return tool_policy(metadata, tool_name=tool_name, default=default)

    return RoleBasedOperationConfig(model=RERUN, event=RERUN, capability=RERUN, tool=RERUN, resolve_tool=resolve_tool)


class JournalBackend(JournalCallableOperationBackend[UnitPolicy]):
    """Journals model requests, tool calls, discovery and capability operations; runs the rest directly.

    (`StepPersistence`'s operations never reach it: `StepDurability` runs them directly.)
    """

    def __init__(self, *, agent_name: str, default_model_id: str | None, in_flight_tools: InFlightPolicy) -> None:
        super().__init__(
            agent_name=agent_name, default_model_id=default_model_id, config=_operation_config(in_flight_tools)
        )

    async def execute(
        self,
        *,
        operation_id: DurableOperationId,
        name: str,
        body: Callable[[], Awaitable[object]],
        cache_key: tuple[object, ...],
        config: UnitPolicy,
    ) -> object:
        workflow = ACTIVE_WORKFLOW.get()
        ctx = _run_context(cache_key)
        if workflow is not None and ctx is not None and ctx.run_id != workflow.workflow_id:
            # A delegate's operation before its own run opened its journal: the enclosing workflow is its parent's.
            workflow = None
        unit = None if workflow is None else self._unit(operation_id, cache_key, workflow)
        if workflow is None or unit is None:
            return await body()
        kind, discriminator, fingerprint, tool_call_id, describe = unit
        stored_before = workflow.counts.replayed
        result = await workflow.run_unit(
            key=workflow.unit_key(name, discriminator),
            name=name,
            kind=kind,
            body=body,
            fingerprint=fingerprint,
            tool_call_id=tool_call_id,
            policy=config if kind == 'tool' else RERUN,
            describe=describe,
        )
        record_durable_unit(executed=workflow.counts.replayed == stored_before)
        return result

    def _unit(
        self, operation_id: DurableOperationId, cache_key: tuple[object, ...], workflow: ActiveWorkflow
    ) -> tuple[UnitKind, str, str | None, str | None, str] | None:
        """How `operation_id` is journaled: kind, discriminator, fingerprint, tool call id, description; `None`
        for an operation that runs directly (argument validation, event handling, cancelling a suspended
        response)."""
        ctx = _run_context(cache_key)
        step = f'step{ctx.run_step}' if ctx is not None else 'step?'
        match operation_id:
            case ModelRequestId(model_id=model_id):
                messages = cache_key[1]
                assert isinstance(messages, list)
                fingerprint = workflow.digests.fingerprint(messages, model_id)
                return 'model', step, fingerprint, None, f'the model request of {step}'
            case ModelCompactMessagesId():
                return 'model', step, None, None, f'the compaction of {step}'
            case ToolsetCallToolId():
                tool_name, arguments = cache_key[0], cache_key[1]
                call_id = ctx.tool_call_id if ctx is not None else None
                assert isinstance(tool_name, str)
                fingerprint = tool_call_fingerprint(tool_name, arguments)
                return 'tool', call_id or step, fingerprint, call_id, f'tool call {tool_name!r} ({call_id})'
            case ToolsetGetToolsId() | ToolsetGetInstructionsId():
                return 'discovery', step, None, None, f'tool discovery of {step}'
            case CapabilityOperationId(capability_id=capability_id, operation=operation):
                return 'capability', step, None, None, f'operation {capability_id}.{operation} of {step}'
            case _:
                return None
