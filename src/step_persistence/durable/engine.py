"""`StepDurability`: the durable-replay engine, a pydantic-ai durability capability over a step store's journal."""

from __future__ import annotations

import logging
import sys
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from step_persistence._cancellation import run_to_completion
from step_persistence._replay import DURABLE_RUN, DurableRun, WorkflowEngine
from step_persistence.capability import StepPersistence
from step_persistence.durable.children import DELEGATING_UNIT
from step_persistence.durable.errors import (
    AskWithoutDeferredOutputError,
    CodeVersionMismatchError,
    LeaseLostError,
    ReplayDivergedError,
)
from step_persistence.durable.fingerprints import inputs_fingerprint
from step_persistence.durable.inputs import journal_deferred_results, journal_inputs, recorded_inputs
from step_persistence.durable.journals import journal_for, journal_media
from step_persistence.durable.leases import DEFAULT_LEASE, Clock, Lease, begin_workflow
from step_persistence.durable.policies import METADATA_KEY, InFlightPolicy, check_policy
from step_persistence.durable.protocol import JournalStore
from step_persistence.durable.records import WorkflowRecord, WorkflowStatus
from step_persistence.durable.workflow import ACTIVE_WORKFLOW, ActiveWorkflow
from step_persistence.protocol import StepStore
from step_persistence.records import StepWrites, utc_now

try:
    from pydantic_ai.durable_exec import (
        JSON_CODEC,
        BaseDurabilityCapability,
        DurabilityEngineSpec,
        conversation_id_from_run_id,
        durable_unit_scope,
        replay_scope,
    )
except ImportError as error:  # pragma: no cover - exercised in a subprocess by tests/durable
    from importlib.metadata import version

    raise ImportError(
        'step_persistence.durable needs pydantic-ai-slim >= 2.68 (pydantic_ai.durable_exec with replay_scope and '
        f'record_durable_unit); this environment has {version("pydantic-ai-slim")}. StepPersistence and the '
        'stores work without it.'
    ) from error

from pydantic_ai import UserPromptNode
from pydantic_ai.agent import EventStreamHandler
from pydantic_ai.agent.abstract import AbstractAgent
from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.capabilities.abstract import AgentNode, NodeResult, WrapNodeRunHandler, WrapRunHandler
from pydantic_ai.exceptions import UserError
from pydantic_ai.models import Model
from pydantic_ai.run import AgentRunResult
from pydantic_ai.tools import AgentDepsT, RunContext
from pydantic_ai.toolsets import AbstractToolset, DynamicToolset, ExternalToolset, FunctionToolset, WrapperToolset

from step_persistence.durable.backend import JournalBackend

__all__ = ['StepDurability']

logger = logging.getLogger('step_persistence.durable')


class StepDurability(BaseDurabilityCapability[AgentDepsT], WorkflowEngine):
    """Makes every run of an agent a durable workflow journaled in `store` (see docs/durable.md).

    The workflow id is the run's `run_id` (`agent.run(..., run_id='order-42')`). Running the agent again
    with the same id and inputs replays the units that completed (no model call, no tool call) and runs
    the rest. A unit in flight when the run stopped runs again if its policy is `rerun` (model requests,
    and tools marked `{'step_persistence': {'in_flight': 'rerun'}}` or `{'idempotent': True}` in their
    metadata); other tools follow `in_flight_tools` (`fail`: the run fails naming the call; `ask`: the run
    ends with `DeferredToolRequests` for it, carrying the ledger's idempotency key and effect summary).

    `event_stream_handler` gets the model's events live, inside each model request's unit, as the request streams
    (`run_stream` and a handler passed to `agent.run` get them only once the request completed), and the run's
    other events (tool calls and results) as they happen. A replayed request delivers no events to it: see
    docs/durable.md, "Streaming".

    `code_version` is recorded with the workflow; a replay under another one raises
    `CodeVersionMismatchError` unless `allow_code_version_change`.

    A run holds its workflow's lease for `lease_duration`, renewed by a heartbeat while it runs; a run
    of a workflow whose lease another live process holds raises `WorkflowHeldError`, and a run whose
    lease was lost (claimed by another process after it expired) stops at its next unit with
    `LeaseLostError`. `clock` gives the time leases are compared with (for tests).

    Toolsets need an `id`, and the agent a `name` (they name the units). Put `StepPersistence` on the
    same agent with the same store to record the run as well, under the workflow id (whatever its
    `agent_name`): its writes are passed through, and a replayed run leaves one record.
    """

    engine_spec = DurabilityEngineSpec(
        engine_name='StepDurability',
        durable_unit_noun='unit',
        durable_container_noun='workflow',
        codec=JSON_CODEC,
        toolset_lifecycles={'function': 'enter-always', 'mcp': 'enter-in-durable-unit', 'dynamic': 'enter-never'},
        tool_config_key=METADATA_KEY,
    )

    def __init__(
        self,
        store: StepStore,
        *,
        code_version: str | None = None,
        allow_code_version_change: bool = False,
        in_flight_tools: InFlightPolicy = 'fail',
        name: str | None = None,
        models: Mapping[str, Model] | None = None,
        event_stream_handler: EventStreamHandler[AgentDepsT] | None = None,
        lease_duration: timedelta = DEFAULT_LEASE,
        clock: Clock = utc_now,
    ) -> None:
        super().__init__(models=models, event_stream_handler=event_stream_handler, name=name)
        if not isinstance(lease_duration, timedelta) or lease_duration <= timedelta(0):
            raise ValueError(f'lease_duration must be a positive timedelta, not {lease_duration!r}')
        journal_for(store)  # a store without a journal is refused here, not at the first run
        self.store = store
        self.code_version = code_version
        self.allow_code_version_change = allow_code_version_change
        self.in_flight_tools = check_policy(in_flight_tools, 'in_flight_tools')
        self.lease_duration = lease_duration
        self.clock = clock
        self._backend: JournalBackend | None = None
        self._recorders: frozenset[str] = frozenset()
        """The `id`s of the agent's `StepPersistence` capabilities, whose operations are not journaled."""
        self._stand_ins: dict[str, _StandIn[AgentDepsT]] = {}
        """By toolset id: the dynamic toolsets standing in for the agent's leaves of other kinds."""

    @property
    def in_durable_context(self) -> bool:
        # Every run of the agent is a workflow, from its start: a toolset is prepared for the run (a dynamic
        # toolset decides there whether its calls are units) before `wrap_run` opens the run's journal. An
        # operation that comes before or after it runs directly (`JournalBackend.execute`).
        return True

    def _bind_to_agent(self, agent: AbstractAgent[AgentDepsT, Any]) -> None:
        recorders: list[str] = []

        def collect(capability: AbstractCapability[AgentDepsT]) -> None:
            if isinstance(capability, StepPersistence) and capability.id is not None:
                recorders.append(capability.id)

        agent.root_capability.apply(collect)
        if recorders:
            # Their operations' arguments name pydantic-ai's messages, which the records resolve on first use:
            # pydantic-ai builds the operations' schemas below.
            StepWrites.model_rebuild()
        self._recorders = frozenset(recorders)
        self._stand_ins = {}
        self._backend = JournalBackend(
            agent_name=self.name, default_model_id=self.default_model_id, in_flight_tools=self.in_flight_tools
        )
        super()._bind_to_agent(agent)  # wraps the toolsets, which bind their operations to the backend

    async def _invoke_capability_operation(
        self,
        capability: AbstractCapability[Any],
        operation: str,
        *,
        ctx: RunContext[Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        if capability.id in self._recorders:
            # `StepPersistence`'s store writes carry idempotency keys: run again on replay, they write nothing
            # twice. So they run as inside a unit (directly), not as units of their own: journaling them would
            # cost two more writes per flush, and a unit's arguments a JSON round trip of the messages written.
            with durable_unit_scope():
                return await super()._invoke_capability_operation(
                    capability, operation, ctx=ctx, args=args, kwargs=kwargs
                )
        return await super()._invoke_capability_operation(capability, operation, ctx=ctx, args=args, kwargs=kwargs)

    def _wrap_leaf_toolset(self, ts: AbstractToolset[AgentDepsT]) -> WrapperToolset[AgentDepsT] | None:
        # pydantic-ai wraps function, dynamic and MCP toolsets. Any other leaf (a toolset class of the application's
        # or of a library: its own `get_tools` and `call_tool`, as an MCP client's) would run directly, its calls
        # made again by every replay; and without the `mcp` package the base never reaches its hook for them
        # (`_wrap_other_leaf_toolset`). Such a leaf is journaled as a dynamic toolset that resolves to it once per
        # run: its discovery and calls are units, and it is entered only when a unit needs it. An
        # `ExternalToolset` runs nothing (its calls are deferred to the caller), and a toolset without an `id`
        # cannot name its units.
        if isinstance(ts, FunctionToolset | DynamicToolset | ExternalToolset) or _is_mcp_toolset(ts):
            return super()._wrap_leaf_toolset(ts)
        toolset_id = ts._explicit_id  # the id chosen for it, as the base reads it
        if toolset_id is None:
            logger.warning(
                'toolset %r has no id: its tool calls are not journaled (a replay calls them again); give it an id',
                ts,
            )
            return None
        stand_in = _StandIn(ts, toolset_id)
        self._stand_ins[toolset_id] = stand_in
        return super()._wrap_leaf_toolset(stand_in)

    def get_wrapper_toolset(self, toolset: AbstractToolset[AgentDepsT]) -> AbstractToolset[AgentDepsT] | None:
        if self._stand_ins:
            # Each leaf journaled as a dynamic toolset is replaced by its stand-in, which the base's wrapper wraps.
            def swap(ts: AbstractToolset[AgentDepsT]) -> AbstractToolset[AgentDepsT]:
                stand_in = self._stand_ins.get(ts._explicit_id or '')
                return stand_in if stand_in is not None and stand_in.original is ts else ts

            toolset = toolset.visit_and_replace(swap)
        return super().get_wrapper_toolset(toolset) or toolset

    def get_durable_operation_backend(self) -> JournalBackend:
        if self._backend is None:
            raise RuntimeError('StepDurability is used before it was bound to an agent')
        return self._backend

    def get_default_run_id(self) -> str | None:
        # A delegate run started without a `run_id` inside a tool unit of a durable run is a child workflow of
        # that unit, under an id derived from the parent's and the tool call's: a replay's delegate is the same.
        delegating = DELEGATING_UNIT.get()
        return None if delegating is None else delegating.next_child_id()

    def get_default_conversation_id(self, run_id: str) -> str | None:
        # Derived from the run id, so a replay's messages carry the same conversation id.
        return conversation_id_from_run_id(run_id)

    async def before_node_run(
        self, ctx: RunContext[AgentDepsT], *, node: AgentNode[AgentDepsT]
    ) -> AgentNode[AgentDepsT]:
        # The run's `deferred_tool_results` are first known here, on its first node: journaled with its inputs.
        if isinstance(node, UserPromptNode):
            workflow = ACTIVE_WORKFLOW.get()
            if workflow is not None and workflow.workflow_id == ctx.run_id:
                await journal_deferred_results(workflow, node.deferred_tool_results)
        return await super().before_node_run(ctx, node=node)

    async def wrap_run(self, ctx: RunContext[AgentDepsT], *, handler: WrapRunHandler) -> AgentRunResult[Any]:
        workflow_id = ctx.run_id
        if workflow_id is None:
            raise RuntimeError('the run context has no run_id to journal the run under')
        journal = journal_for(self.store)
        inputs: dict[str, Any] = {
            'fingerprint': inputs_fingerprint(ctx.prompt, ctx.messages),
            **await recorded_inputs(self.store, ctx.prompt, ctx.messages),
        }
        parent = DELEGATING_UNIT.get()
        if parent is not None:
            inputs['parent'] = parent.as_parent()
        stored = await journal.get_workflow(workflow_id=workflow_id)
        if stored is not None:
            # Refused before the workflow is started again, so a refused run leaves it as it was (its status,
            # its attempts): a workflow's code version and inputs never change once stored.
            self._check_replayable(stored, inputs)
        record, lease = await begin_workflow(
            journal,
            WorkflowRecord(
                workflow_id=workflow_id,
                agent_name=self.name,
                run_id=workflow_id,
                code_version=self.code_version,
                inputs=inputs,
            ),
            duration=self.lease_duration,
            clock=self.clock,
            take_over=parent is not None,
        )
        was_completed = stored is not None and stored.status == 'completed'
        return await self._run_holding(ctx, handler, journal, record, lease, inputs, was_completed)

    async def _run_holding(
        self,
        ctx: RunContext[AgentDepsT],
        handler: WrapRunHandler,
        journal: JournalStore,
        record: WorkflowRecord,
        lease: Lease,
        inputs: dict[str, Any],
        was_completed: bool,
    ) -> AgentRunResult[Any]:
        """Run the workflow `record` holding `lease` (renewed by a heartbeat): replay and journal its units, end it
        (fenced). A workflow `was_completed` stays completed if this run raises before running any unit."""
        workflow_id = record.workflow_id
        try:
            if record.attempts > 1:  # again, as started: another process may have started it since it was read
                self._check_replayable(record, inputs)
            units = await journal.list_units(workflow_id=workflow_id)
            media = journal_media(self.store)
            # So that `recover_abandoned` can start the run again: the inputs its record refers to, once.
            await journal_inputs(journal, media, record, units, ctx.prompt, ctx.messages, lease.fence)
        except BaseException:
            await _end_failed(journal, workflow_id, lease, keep_completed=was_completed)
            raise
        workflow = ActiveWorkflow(
            journal=journal,
            record=record,
            stored={unit.unit_key: unit for unit in units},
            media=media,
            lease=lease,
        )
        durable = DurableRun(
            run_id=workflow_id,
            started_at=record.created_at,
            completed_tool_calls=frozenset(
                unit.tool_call_id
                for unit in units
                if unit.kind == 'tool' and unit.status == 'completed' and unit.tool_call_id is not None
            ),
            replaying=bool(units),
        )
        workflow_token = ACTIVE_WORKFLOW.set(workflow)
        durable_token = DURABLE_RUN.set(durable)
        delegating_token = DELEGATING_UNIT.set(None)  # the run's own tool units are the parents of its delegates
        try:
            # The heartbeat stops before the workflow's end, which releases the lease.
            async with lease.heartbeat():
                with replay_scope():
                    result = await super().wrap_run(ctx, handler=handler)
        except BaseException:
            # A completed workflow's journal holds its whole run: a later run that ran no unit (refused by a unit's
            # fingerprint, or by a capability as it started) changed nothing of it.
            await _end_failed(
                journal, workflow_id, lease, keep_completed=was_completed and workflow.counts.executed == 0
            )
            raise
        finally:
            DELEGATING_UNIT.reset(delegating_token)
            DURABLE_RUN.reset(durable_token)
            ACTIVE_WORKFLOW.reset(workflow_token)
            counts = workflow.counts
            logger.info(
                'durable workflow %r (attempt %d): %d units replayed, %d executed (%d of them in flight before)',
                workflow_id,
                record.attempts,
                counts.replayed,
                counts.executed,
                counts.rerun,
            )
        await run_to_completion(journal.end_workflow(workflow_id=workflow_id, status='completed', fence=lease.fence))
        return result

    async def wrap_node_run(
        self, ctx: RunContext[AgentDepsT], *, node: AgentNode[AgentDepsT], handler: WrapNodeRunHandler[AgentDepsT]
    ) -> NodeResult[AgentDepsT]:
        try:
            return await super().wrap_node_run(ctx, node=node, handler=handler)
        except UserError as error:
            # pydantic-ai's error for deferred calls the run's output type cannot hold (a capability cannot see a
            # run's own output type before), said of the calls the `ask` policy handed back.
            workflow = ACTIVE_WORKFLOW.get()
            if workflow is None or workflow.workflow_id != ctx.run_id or not workflow.handed_back:
                raise
            if 'DeferredToolRequests' not in str(error):
                raise
            raise AskWithoutDeferredOutputError(workflow_id=workflow.workflow_id, calls=workflow.handed_back) from error

    def _check_replayable(self, record: WorkflowRecord, inputs: dict[str, Any]) -> None:
        if record.agent_name != self.name:
            # Its units are named by the agent that ran them, and `recover_abandoned` resumes it with that agent.
            raise ReplayDivergedError(
                workflow_id=record.workflow_id,
                unit_key='(the run itself)',
                what=f'the workflow was started by agent {record.agent_name!r}, and this is agent {self.name!r}',
            )
        if record.code_version != self.code_version and not self.allow_code_version_change:
            raise CodeVersionMismatchError(
                workflow_id=record.workflow_id, recorded=record.code_version, running=self.code_version
            )
        if record.inputs.get('fingerprint') != inputs['fingerprint']:
            raise ReplayDivergedError(
                workflow_id=record.workflow_id,
                unit_key='(the run itself)',
                what='the run was started with another prompt or message history',
            )


async def _end_failed(journal: JournalStore, workflow_id: str, lease: Lease, *, keep_completed: bool) -> None:
    """Mark the workflow `failed` (`completed` again with `keep_completed`), fenced, unless this run lost its lease:
    another process resumes it then, and its status is that process's to set (the run's own error is raised
    either way)."""
    status: WorkflowStatus = 'completed' if keep_completed else 'failed'
    try:
        await run_to_completion(journal.end_workflow(workflow_id=workflow_id, status=status, fence=lease.fence))
    except LeaseLostError:
        logger.warning('durable workflow %r: not marked failed, this run lost its lease', workflow_id)


def _is_mcp_toolset(ts: AbstractToolset[Any]) -> bool:
    """Whether `ts` is pydantic-ai's `MCPToolset` (which needs the `mcp` package), wrapped by the base as such."""
    mcp = sys.modules.get('pydantic_ai.mcp')
    toolset_class = None if mcp is None else getattr(mcp, 'MCPToolset', None)
    return isinstance(toolset_class, type) and isinstance(ts, toolset_class)


class _StandIn(DynamicToolset[AgentDepsT]):
    """A dynamic toolset resolving to `original` once per run, so that pydantic-ai journals a leaf of another kind."""

    def __init__(self, original: AbstractToolset[AgentDepsT], toolset_id: str) -> None:
        def resolve(ctx: RunContext[AgentDepsT]) -> AbstractToolset[AgentDepsT]:
            return original

        super().__init__(resolve, per_run_step=False, id=toolset_id)
        self.original = original
