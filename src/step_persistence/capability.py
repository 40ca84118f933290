"""`StepPersistence`: the pydantic-ai capability that records a run step by step."""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import KW_ONLY, dataclass, field
from typing import Any, Literal, TypeVar

from pydantic_ai import CallToolsNode, ModelRequestNode
from pydantic_ai.capabilities import AbstractCapability, durable_operation
from pydantic_ai.capabilities.abstract import (
    AgentNode,
    NodeResult,
    ValidatedToolArgs,
    WrapModelRequestHandler,
    WrapNodeRunHandler,
    WrapOutputProcessHandler,
    WrapRunHandler,
    WrapToolExecuteHandler,
)
from pydantic_ai.exceptions import ApprovalRequired, CallDeferred, RunCancelled, RunTimedOut, ToolRetryError
from pydantic_ai.messages import (
    CapabilityEvent,
    ModelMessage,
    ModelRequest,
    ModelRequestPart,
    ModelResponse,
    ToolCallPart,
    ToolReturn,
    ToolReturnPart,
)
from pydantic_ai.models import Model, ModelRequestContext, StreamedResponse
from pydantic_ai.output import OutputContext
from pydantic_ai.result import FinalResult
from pydantic_ai.run import AgentRunResult
from pydantic_ai.tools import AgentDepsT, RunContext, ToolDefinition
from pydantic_core import ValidationError
from pydantic_graph import End

from step_persistence._active import ACTIVE_RUN, ActiveRun
from step_persistence._cancellation import run_to_completion
from step_persistence._history import EncodedMessage, HistoryEncoder
from step_persistence._lru import BoundedLru
from step_persistence._reading import logger
from step_persistence._replay import InFlightRefusal, durable_run_of, journals_runs_of
from step_persistence._stored_writes import StoredWrites
from step_persistence._stream_watch import StreamWatch
from step_persistence._telemetry import RunSpans
from step_persistence._urls import redact_url
from step_persistence.helpers import unanswered_tool_call_ids
from step_persistence.origins import find_origin
from step_persistence.protocol import StepStore, batch_writer, write_steps
from step_persistence.records import (
    ContinuableSnapshot,
    EventKind,
    RunRecord,
    SnapshotState,
    StepEvent,
    StepWrites,
    TokenUsage,
    ToolEffectRecord,
    utc_now,
)
from step_persistence.run_ids import derive_run_id
from step_persistence.stores.memory import InMemoryStepStore

__all__ = ['SnapshotSaved', 'StepPersistence']

ENCODINGS_KEPT = 4096
"""How many settled messages' encodings one `StepPersistence` keeps for its next runs."""

SnapshotReason = Literal['tool_cycle', 'before_request', 'after_response', 'final', 'failure']


@dataclass(repr=False, kw_only=True)
class SnapshotSaved(CapabilityEvent, namespace='step_persistence', name='step_snapshot_saved', dispatch='immediate'):
    """Emitted after each snapshot write; capability listeners (`on_event`) receive it before the run goes on.

    Its kind is `step_persistence.step_snapshot_saved`: pydantic-ai keeps one process-wide registry
    of event kinds, and `pydantic-ai-harness` registers `step_persistence.snapshot_saved`, so this
    library and that one can be imported in the same process.

    The snapshots written as a run ends (final or failure) come after the run's event stream has
    closed, so an `event_stream_handler` sees only the ones written during the run's steps.
    """

    run_id: str
    conversation_id: str | None
    step_index: int
    state: Literal['complete', 'interrupted']

    @property
    def persistence_run_id(self) -> str:
        """`run_id`, under the name the seed's event uses."""
        return self.run_id


@dataclass
class _RunState:
    """What one run's persistence needs between hooks; lives on the `for_run` copy."""

    active: ActiveRun
    conversation_id: str | None
    parent_run_id: str | None
    agent_name: str | None
    write_batch: Callable[[StepWrites], Awaitable[None]] | None
    """The store's `write_batch`, looked up once per run (`None`: the store writes call by call)."""
    spans: RunSpans
    """The record's identity on pydantic-ai's spans of the run (does nothing unless the run is traced)."""
    encoder: HistoryEncoder = field(default_factory=HistoryEncoder)
    live_messages: list[ModelMessage] | None = None
    """The run's message history list, as seen by node hooks (the run context's own may be stale)."""
    source_run_id: str | None = None
    """pydantic-ai's id of the run (`ctx.run_id`), which the messages it builds carry."""
    registered: bool = False
    """Whether `before_run` registered the run: a run refused at registration writes nothing else."""
    ended: bool = False
    """Whether the run's terminal event is queued; nothing is queued after it."""
    open_request: int | None = None
    """The step of the model request started and not yet ended (events), if any."""
    request_streams: bool = True
    """Whether the model request being sent is streamed (`ModelRequestContext.streaming`): only then is its
    model watched (`get_wrapper_model`), since only a stream can hold a response its handler has not returned."""
    stream: StreamedResponse | None = None
    """The stream the open model request is answered on, once its model opened one (`StreamWatch`).

    `run_stream` runs the function calls of its final response before it hands the response back, so
    the request's ending event, queued before those calls start, reads the response here."""
    pending_request: ModelRequest | None = None
    """The request a settled tool cycle will send next, until the next model request puts it in the history.

    A run stopped between the two (leaving `agent.iter` after a tool cycle) never gets it into its
    history, but its returns are settled: the failure snapshot folds it in, as the tool-cycle one would.
    """
    tool_cycle_step: int | None = None
    """The step of the settled tool cycle whose snapshot waits for its request to be sent (`None`: none waits).

    pydantic-ai stamps the request's `timestamp` in place as it sends it, so the snapshot is taken
    then, in the same flush as the request's start: the stored request is the one the history
    keeps, stored once, and a crash in between loses nothing that was durable."""
    final_result: FinalResult[Any] | None = None
    """The final result the graph ended with (`End`), to answer its output call when the history does not."""
    streamed_output: FinalResult[Any] | None = None
    """The output validated whole (not partially) from the stream of the model request still open, with the
    output call it came from; `None` once the run moves on (a node hook, the next model request)."""
    stream_cancelled: bool = False
    """Whether the last model request's handler handed back a response in state `interrupted`, which is how
    pydantic-ai records a stream cancelled with `StreamedRunResult.cancel()`; `False` once the run moves on."""
    output_tool_names: set[str] = field(default_factory=set[str])
    """Names of the output tools offered during the run."""
    ran: set[str] = field(default_factory=set[str])
    """Ids of the calls whose tool body started in the current tool cycle."""
    results: dict[str, Any] = field(default_factory=dict[str, Any])
    """Return values of the calls completed in the current tool cycle, by `tool_call_id`."""
    last_snapshot: tuple[EncodedMessage, ...] | None = None
    """The messages of the last snapshot written, to skip an unchanged final one."""
    step: int = 0
    """The latest `run_step` seen by a step-level hook (the run-level context keeps its initial value)."""
    key_counts: dict[str, int] = field(default_factory=dict[str, int])
    completed_calls: dict[str, ToolEffectRecord] = field(default_factory=dict[str, ToolEffectRecord])
    """Calls recorded `completed` in the current tool cycle, by `tool_call_id`."""
    failure_recorded: bool = False
    """Whether the failure snapshot of the current failure has been written."""
    pending: StepWrites = field(default_factory=StepWrites)
    """Writes queued since the last flush (see `StepPersistence._flush`)."""
    flushing: asyncio.Lock = field(default_factory=asyncio.Lock)
    """Serializes this run's flushes, so its writes land in the order they were queued."""
    stored: StoredWrites | None = None
    """Under a durable replay, the record as the replay found it: a flush it already holds is not written."""

    @property
    def run_id(self) -> str:
        return self.active.run_id

    def take_pending(self) -> StepWrites:
        writes, self.pending = self.pending, StepWrites()
        return writes

    def key(self, *parts: object) -> str:
        """A deterministic idempotency key: the same writes of a replayed run get the same keys."""
        base = ':'.join(map(str, (self.run_id, *parts)))
        count = self.key_counts.get(base, 0)
        self.key_counts[base] = count + 1
        return base if count == 0 else f'{base}:{count}'


_F = TypeVar('_F', bound=Callable[..., Any])


def _signature_computed_once(function: _F) -> _F:
    """`function` with its `inspect.Signature` stored as `__signature__`, where `inspect.signature` looks first.

    `durable_operation` binds every call's arguments with `inspect.signature(...)`, which would
    otherwise rebuild the signature at each of the two flushes of every step.
    """
    function.__signature__ = inspect.signature(function)  # type: ignore[attr-defined]
    return function


async def register_run_once(store: StepStore, record: RunRecord) -> None:
    """Register `record`, treating an identical stored record as this same registration replayed.

    A different record under the same run id still raises `ValueError`. (A `continued` origin the
    store recorded as `forked`, another run having continued the snapshot first, is the same.)
    """
    try:
        await store.register_run(record)
    except ValueError:
        stored = await store.get_run(run_id=record.run_id)
        if stored is None or _as_registered(record, stored) != stored:
            raise


def _as_registered(record: RunRecord, stored: RunRecord) -> RunRecord:
    """`record` as the store would have registered it, given the origin kind it chose."""
    if record.origin is None or stored.origin is None or stored.origin.kind == record.origin.kind:
        return record
    return record.model_copy(update={'origin': record.origin.model_copy(update={'kind': stored.origin.kind})})


def _failure_summary(error: BaseException) -> str:
    if isinstance(error, ToolRetryError):
        return f'retried: the tool asked the model to retry (ModelRetry) without returning a result: {error}'
    if isinstance(error, CallDeferred | ApprovalRequired):
        return f'deferred: the call was handed off ({type(error).__name__}) without a result in this run'
    if isinstance(error, RunTimedOut):
        return 'cancelled before returning a result: the run timed out; its side effect may be partial'
    if isinstance(error, RunCancelled):
        return 'cancelled before returning a result: the run was cancelled; its side effect may be partial'
    if isinstance(error, asyncio.CancelledError):
        return (
            'cancelled before returning a result (the run was cancelled, or a sibling call failed); '
            'its side effect may be partial'
        )
    return f'failed: {error!r}'


def _described(ctx: RunContext[Any], error: BaseException) -> BaseException:
    """The error to record for `error`: a cancellation pydantic-ai will raise as `RunTimedOut`/`RunCancelled` as that.

    Hooks see the cancellation itself; pydantic-ai translates it into `RunTimedOut` (the run's
    `timeout=` passed) or `RunCancelled` (`ctx.cancel()`, `AgentRun.cancel()`, a cancellation
    token) only at the run's outer edge, after every hook has run. Its controller says which;
    a passed deadline says so too, should the controller not be reachable.
    """
    if not isinstance(error, asyncio.CancelledError):
        return error
    # Read via `__dict__`, as pydantic-ai's own `RunContext.cancel` does.
    cancellation = ctx.__dict__.get('_cancellation')
    if cancellation is None:
        remaining = ctx.remaining_time()
        timed_out, requested = remaining is not None and remaining <= 0, False
    else:
        timed_out = bool(getattr(cancellation, 'timed_out', False))
        requested = bool(getattr(cancellation, 'cancel_requested', False))
    if timed_out:
        return RunTimedOut('The agent run timed out.')
    if requested:
        return RunCancelled('The agent run was cancelled.')
    return error


def _cut_short(response: ModelResponse) -> str | None:
    """Why `response` is not a whole response (a stream stopped before its end), or `None` if it is."""
    if response.state in ('incomplete', 'interrupted'):
        return f'the response stream stopped before the response was complete (state {response.state!r})'
    return None


def _token_usage(response: ModelResponse) -> TokenUsage | None:
    """The tokens `response` reported; `None` if it reported none (pydantic-ai's `unmeasured_requests`) or counts
    no record holds (a negative one, say: logged), which never fails the run."""
    usage = response.usage
    if usage.unmeasured_requests:
        return None
    try:
        return TokenUsage(
            input_tokens=usage.input_tokens,
            output_tokens=usage.output_tokens,
            cache_read_tokens=usage.cache_read_tokens,
            cache_write_tokens=usage.cache_write_tokens,
        )
    except ValidationError as error:
        logger.warning('recording a model response without its usage, which no record holds: %s', error)
        return None


_FINAL_RESULT_PROCESSED = 'Final result processed.'
_OUTPUT_NOT_USED = 'Output tool not used - a final result was already processed.'
_OUTPUT_NOT_FINAL = 'Output tool processed, but its value will not be the final result of the agent run.'
_TOOL_NOT_EXECUTED = 'Tool not executed - a final result was already processed.'
"""The returns pydantic-ai gives the calls of a final response (`pydantic_ai._tool_execution`); the
tests pin them against what `run_stream` puts in its result's history."""


def _return_part(call: ToolCallPart, result: Any) -> ToolReturnPart:
    """The return pydantic-ai records for a function tool call that returned `result`."""
    if isinstance(result, ToolReturn):
        return ToolReturnPart(
            tool_name=call.tool_name,
            content=result.return_value,
            tool_call_id=call.tool_call_id,
            metadata=result.metadata,
        )
    return ToolReturnPart(tool_name=call.tool_name, content=result, tool_call_id=call.tool_call_id)


def _position_of(message: ModelMessage, history: Sequence[ModelMessage]) -> int | None:
    """The position of `message` (this object) in `history`, searched from the end, where a request just sent is."""
    for index in range(len(history) - 1, -1, -1):
        if history[index] is message:
            return index
    return None


_WRITES_USED = ('register_run', 'get_run', 'append_event', 'save_snapshot', 'record_tool_effect')
"""The store methods the capability calls (a store that batches also has `write_batch`)."""

_STREAM_CANCELLED = (
    'the response stream was cancelled (StreamedRunResult.cancel()) before an output was read from it, '
    'so the run has no result'
)
"""The error of a run whose stream was cancelled, ending with no output read (pydantic-ai then tears it down)."""

_DISCARDED_SUMMARY = (
    'the tool returned, but its result was discarded when the run failed or was cancelled; its side effect took place'
)


@dataclass
class StepPersistence(AbstractCapability[AgentDepsT]):
    """Records every step of an agent run into a `StepStore`.

    One instance serves many runs. Per run it writes an append-only event log, snapshots of the
    message history at every settled tool cycle (and at the end, and at failure), and a ledger of
    tool side effects. See the documentation for how run ids and lineage are resolved.
    """

    store: StepStore = field(default_factory=InMemoryStepStore)
    """Where the run is recorded."""
    agent_name: str | None = None
    """Recorded on every record; when set (and `run_id` is not), run ids are derived from it, except a durable
    run's (an agent with `StepDurability`), recorded under its workflow id."""
    run_id: str | None = None
    """An explicit run id for exactly one run of this instance. On the per-run copy (`for_run`),
    the id the run is recorded under, derived or not."""
    parent_run_id: str | None = None
    """Explicit parent; by default the enclosing persisted run, if any."""
    metadata: dict[str, str] = field(default_factory=dict[str, str])
    """Copied onto the run record and every event."""
    capture_frontier: bool = False
    """Also snapshot before each model request and after each model response."""
    span_attributes: bool = True
    """Put the record's identity (run id, lineage, snapshots, ledger) on the OpenTelemetry spans of
    pydantic-ai's instrumentation, when it instruments the run (docs/observability.md)."""
    _: KW_ONLY
    id: str | None = 'step_persistence'

    _explicit_run_claimed_by: str | None = field(default=None, init=False, repr=False, compare=False)
    _state: _RunState | None = field(default=None, init=False, repr=False, compare=False)
    _encodings: BoundedLru[int, tuple[ModelMessage, EncodedMessage]] = field(
        default_factory=lambda: BoundedLru(ENCODINGS_KEPT), init=False, repr=False, compare=False
    )
    """Encodings of settled messages across this instance's runs (a chat's next turn reuses them)."""

    def __post_init__(self) -> None:
        """Refuse, at construction rather than at the first write, a `store` that is not a `StepStore`."""
        if isinstance(self.store, str):
            raise TypeError(
                f'store must be a StepStore, not the string {redact_url(self.store)!r}: build one with '
                'step_persistence.from_spec(...) (and close it when done), or use StepPersistence.from_spec(store=...)'
            )
        missing = [name for name in _WRITES_USED if not callable(getattr(self.store, name, None))]
        if missing:
            raise TypeError(f'store must be a StepStore, not {type(self.store).__name__} (it has no {missing[0]})')

    # --- per-run setup ---

    async def for_run(self, ctx: RunContext[Any]) -> StepPersistence[AgentDepsT]:
        run_id = self._resolve_run_id(ctx)
        enclosing = ACTIVE_RUN.get()
        parent_run_id = self.parent_run_id
        if parent_run_id is None and enclosing is not None and enclosing.run_id != run_id:
            parent_run_id = enclosing.run_id
        agent_name = self.agent_name
        if agent_name is None and ctx.agent is not None:
            agent_name = ctx.agent.name
        copy = dataclasses.replace(self, run_id=run_id)
        copy._encodings = self._encodings
        copy._state = _RunState(
            active=ActiveRun(run_id=run_id, store=self.store),
            write_batch=batch_writer(self.store),
            spans=RunSpans(run_id=run_id),
            conversation_id=ctx.conversation_id,
            parent_run_id=parent_run_id,
            agent_name=agent_name,
            source_run_id=ctx.run_id,
            encoder=HistoryEncoder(self._encodings),
        )
        return copy

    def _resolve_run_id(self, ctx: RunContext[Any]) -> str:
        # A durable run (an agent with `StepDurability`) is recorded under its workflow id, pydantic-ai's run id:
        # `get_run`, `runs show` and `continue_run` find it under the id the run was given.
        journaled = journals_runs_of(ctx.agent)
        if self.run_id is not None:
            if journaled and self.run_id != ctx.run_id:
                raise ValueError(
                    f'StepPersistence(run_id={self.run_id!r}) on an agent with StepDurability: a durable run is '
                    f'recorded under its workflow id ({ctx.run_id!r}); give the id to agent.run(..., '
                    f'run_id={self.run_id!r}) instead'
                )
            claimed_by = self._explicit_run_claimed_by
            if claimed_by is not None and claimed_by != ctx.run_id:
                raise ValueError(
                    f'StepPersistence(run_id={self.run_id!r}) was already used for another run; an explicit '
                    'run_id names exactly one run. Use agent_name= or conversation_id= to group several runs.'
                )
            self._explicit_run_claimed_by = ctx.run_id
            return self.run_id
        if ctx.run_id is None:
            raise RuntimeError('the run context has no run_id to persist the run under')
        if self.agent_name is not None and not journaled:
            return derive_run_id(self.agent_name, ctx.run_id)
        return ctx.run_id

    def compaction_transcript_handle(self) -> str | None:
        """The run id this store keeps the current run's history under (`None` outside a run).

        An identifier, not a promise: retention may already have pruned older snapshots.
        """
        if self._state is not None:
            return self._state.run_id
        active = ACTIVE_RUN.get()
        return None if active is None else active.run_id

    @property
    def _run(self) -> _RunState:
        if self._state is None:
            raise RuntimeError('StepPersistence hooks ran on an instance that was not prepared by for_run')
        return self._state

    # --- durable store writes ---

    @durable_operation(name='register_run')
    @_signature_computed_once
    async def _persist_run(self, ctx: RunContext[Any], record: RunRecord) -> None:
        await register_run_once(self.store, record)

    @durable_operation(name='write_steps')
    @_signature_computed_once
    async def _persist_writes(self, ctx: RunContext[Any], writes: StepWrites) -> None:
        await write_steps(self.store, writes, write_batch=self._run.write_batch)

    async def _flush(self, ctx: RunContext[Any]) -> None:
        """Write everything queued for the run, in one batch, and announce its snapshots.

        Writes are queued as the run goes and flushed where durability matters: before a model
        request is sent, before a tool body runs, when a tool call ends without a result or while
        sibling calls still run, and when the run ends (docs/capability.md, "Durability"). The
        flush runs to its end even if the caller is cancelled meanwhile. Under a durable replay, a
        flush the run's record already holds (the run replayed writes the same) is not written.
        """
        run = self._run

        async def flush() -> StepWrites:
            async with run.flushing:
                writes = run.take_pending()
                if not writes.is_empty() and (run.stored is None or not run.stored.hold(writes)):
                    await self._persist_writes(ctx, writes)
                if writes.snapshots and run.spans.traced:
                    await run.spans.snapshots_saved(self.store, writes.snapshots)
                return writes

        written = await run_to_completion(flush())
        for snapshot in written.snapshots:
            await ctx.emit(
                SnapshotSaved(
                    run_id=snapshot.run_id,
                    conversation_id=snapshot.conversation_id,
                    step_index=snapshot.step_index,
                    state=snapshot.state,
                )
            )

    # --- record builders ---

    def _queue_event(
        self,
        kind: EventKind,
        *,
        step_index: int,
        key: str,
        tool: ToolEffectRecord | None = None,
        error: BaseException | str | None = None,
        response: ModelResponse | None = None,
    ) -> None:
        """Queue an event; `response` (on the event ending a model request) gives its model name and usage."""
        run = self._run
        if run.ended:
            return
        model_name = None if response is None else response.model_name
        run.pending.events.append(
            StepEvent(
                run_id=run.run_id,
                kind=kind,
                step_index=step_index,
                conversation_id=run.conversation_id,
                parent_run_id=run.parent_run_id,
                agent_name=run.agent_name,
                tool_call_id=None if tool is None else tool.tool_call_id,
                tool_name=None if tool is None else tool.tool_name,
                error=error if error is None or isinstance(error, str) else repr(error),
                metadata=dict(self.metadata),
                idempotency_key=key,
                model_name=model_name if isinstance(model_name, str) else None,
                usage=None if response is None else _token_usage(response),
            )
        )

    def _queue_terminal(self, kind: Literal['run_completed', 'run_failed'], *, error: BaseException | None) -> None:
        """Queue the run's one terminal event; everything the run still owes is queued before it."""
        run = self._run
        self._queue_event(kind, step_index=run.step, key=run.key(kind), error=error)
        run.ended = True

    def _queue_snapshot(
        self,
        messages: Sequence[ModelMessage],
        *,
        step_index: int,
        reason: SnapshotReason,
        skip_if_unchanged: bool = False,
    ) -> None:
        run = self._run
        if run.ended:
            return
        history = run.encoder.encode(messages)
        if skip_if_unchanged and history.messages == run.last_snapshot:
            return
        state: SnapshotState = 'interrupted' if history.unanswered else 'complete'
        run.pending.snapshots.append(
            ContinuableSnapshot.from_encoded(
                run_id=run.run_id,
                step_index=step_index,
                messages=list(messages),
                encoded=history.messages,
                state=state,
                conversation_id=run.conversation_id,
                parent_run_id=run.parent_run_id,
                agent_name=run.agent_name,
                idempotency_key=run.key('snapshot', step_index, reason),
            )
        )
        run.last_snapshot = history.messages

    def _end_model_request(self, error: BaseException | str | None, response: ModelResponse | None = None) -> None:
        """Queue the ending event of the model request in flight, if one is: it ends exactly once.

        `response` is the one pydantic-ai handed back; a request that completes before that (the final
        response of `run_stream`, whose calls run first) takes it from its stream.
        """
        run = self._run
        step = run.open_request
        if step is None:
            return
        run.open_request = None
        stream, run.stream = run.stream, None
        if response is None and error is None and stream is not None:
            response = stream.get()
        if error is None:
            key = run.key('model', step, 'completed')
            self._queue_event('model_request_completed', step_index=step, key=key, response=response)
        else:
            key = run.key('model', step, 'failed')
            self._queue_event('model_request_failed', step_index=step, key=key, error=error, response=response)

    # --- run lifecycle ---

    async def wrap_run(self, ctx: RunContext[Any], *, handler: WrapRunHandler) -> AgentRunResult[Any]:
        run = self._run
        if self.span_attributes:
            run.spans.start(ctx, conversation_id=run.conversation_id, parent_run_id=run.parent_run_id)
        token = ACTIVE_RUN.set(run.active)
        try:
            return await handler()
        except BaseException as error:
            if run.registered:
                recorded = _described(ctx, error)
                if run.stream_cancelled and recorded is error and isinstance(error, asyncio.CancelledError):
                    # pydantic-ai tears down a run whose stream the caller cancelled (`StreamedRunResult.cancel()`).
                    if run.streamed_output is not None and not run.failure_recorded and not run.active.in_flight:
                        # The caller read the output whole: it holds it, and `StreamedRunResult.result`.
                        run.final_result = run.streamed_output
                        await self._complete(ctx, list(run.live_messages or ()))
                        raise
                    recorded = asyncio.CancelledError(_STREAM_CANCELLED)
                # `wrap_run` runs in a task of its own: a model request or tool call of the run may
                # not have reached its own error handling yet, so the failure closes them here, and
                # their handlers then find nothing left to write. The terminal event goes last.
                if not run.failure_recorded:
                    self._queue_failure(recorded)
                self._end_model_request(recorded)
                # A call whose start was queued after the failure was recorded (a sibling task the
                # cancellation reached late) is still open: it ends before the terminal event.
                self._settle_in_flight(recorded)
                # A call pydantic-ai started after the failure snapshot was taken may have completed
                # since: its return is in no snapshot, so its result is discarded, as the failure's are.
                self._discard_completed_calls()
                self._queue_terminal('run_failed', error=recorded)
                await self._flush(ctx)
            raise
        finally:
            ACTIVE_RUN.reset(token)

    async def before_run(self, ctx: RunContext[Any]) -> None:
        run = self._run

        async def register() -> None:
            initial = ctx.messages
            origin = await find_origin(
                self.store, initial, run.encoder.encode(initial).messages, conversation_id=run.conversation_id
            )
            if origin is not None and origin.run_id == run.run_id:
                # The run's own snapshot has the history it starts from (a replay of a run that ended where it
                # started): a run never continues itself, so its origin is the one it was registered with.
                registered = await self.store.get_run(run_id=run.run_id)
                origin = None if registered is None else registered.origin
            # A durable run registers with its workflow's first start: a replay's registration is the same one.
            durable = durable_run_of(ctx.run_id)
            record = RunRecord(
                run_id=run.run_id,
                conversation_id=run.conversation_id,
                parent_run_id=run.parent_run_id,
                agent_name=run.agent_name,
                metadata=dict(self.metadata),
                origin=origin,
                **({} if durable is None else {'started_at': durable.started_at}),
            )
            if durable is not None and durable.replaying:
                run.stored = await StoredWrites.load(self.store, run_id=run.run_id)
            if not await self._registered_before(record):
                await self._persist_run(ctx, record)
            run.registered = True
            run.spans.registered(origin)
            self._queue_event('run_started', step_index=ctx.run_step, key=run.key('run_started'))

        # To its end, so that a run cancelled meanwhile (a short `timeout=`) knows whether its record
        # landed: a registered run always gets its `run_started` and terminal events.
        await run_to_completion(register())

    async def _registered_before(self, record: RunRecord) -> bool:
        """Whether a durable replay finds `record` registered by the run it replays (then it registers nothing)."""
        if self._run.stored is None:
            return False
        stored = await self.store.get_run(run_id=record.run_id)
        return stored is not None and _as_registered(record, stored) == stored

    async def after_run(self, ctx: RunContext[Any], *, result: AgentRunResult[Any]) -> AgentRunResult[Any]:
        self._end_model_request(None)
        await self._complete(ctx, result.all_messages())
        return result

    async def _complete(self, ctx: RunContext[Any], messages: list[ModelMessage]) -> None:
        """Queue the final snapshot of `messages` (the final response's calls answered) and `run_completed`; flush."""
        run = self._run
        messages = self._answer_final_output(ctx, messages)
        self._queue_snapshot(messages, step_index=run.step, reason='final', skip_if_unchanged=True)
        self._queue_terminal('run_completed', error=None)
        await self._flush(ctx)

    def _answer_final_output(self, ctx: RunContext[Any], messages: list[ModelMessage]) -> list[ModelMessage]:
        """`messages`, with the request answering the final response's calls when the history lacks it.

        `run_stream` ends a run whose output came from an output tool without adding that request to the
        run's history: it adds it to the stream result's copy only (`StreamedRunResult.all_messages()`).
        `run` adds it to the history. The request is rebuilt here as `run_stream` builds it (the order
        and words of pydantic-ai's `end_strategy`), from the final result, the calls this step executed
        and the output tools offered, so that the final snapshot is the same history under both.
        """
        run = self._run
        final = run.final_result
        if final is None or final.tool_call_id is None or not messages:
            return messages
        last = messages[-1]
        if not isinstance(last, ModelResponse) or all(c.tool_call_id != final.tool_call_id for c in last.tool_calls):
            return messages  # the history answers it (`run`), or the output came from elsewhere
        unanswered = set(unanswered_tool_call_ids(messages))
        if final.tool_call_id not in unanswered:
            return messages
        strategy = getattr(ctx.agent, 'end_strategy', 'graceful')
        open_calls = [call for call in last.tool_calls if call.tool_call_id in unanswered]

        def is_output(call: ToolCallPart) -> bool:
            return call.tool_call_id == final.tool_call_id or call.tool_name in run.output_tool_names

        if strategy == 'early':  # output calls run first, then the function calls are skipped
            open_calls = [call for call in open_calls if is_output(call)] + [c for c in open_calls if not is_output(c)]
        parts: list[ModelRequestPart] = []
        for call in open_calls:
            if call.tool_call_id == final.tool_call_id:
                parts.append(ToolReturnPart(call.tool_name, _FINAL_RESULT_PROCESSED, call.tool_call_id))
            elif call.tool_call_id in run.results:
                parts.append(_return_part(call, run.results[call.tool_call_id]))
            elif call.tool_call_id in run.ran:
                continue  # it ran without a result (it raised, or was deferred): it stays unanswered
            elif is_output(call):
                skipped = _OUTPUT_NOT_FINAL if strategy == 'exhaustive' else _OUTPUT_NOT_USED
                parts.append(ToolReturnPart(call.tool_name, skipped, call.tool_call_id))
            else:
                parts.append(ToolReturnPart(call.tool_name, _TOOL_NOT_EXECUTED, call.tool_call_id))
        request = ModelRequest(parts=parts, run_id=run.source_run_id, conversation_id=run.conversation_id)
        return [*messages, request]

    def _queue_failure(self, error: BaseException) -> None:
        """Close what the failure ended (the model request, the calls in flight or whose result it lost), then snapshot.

        A cancelled run reaches its failure hooks before its tool calls are torn down, so calls
        still in flight are closed here, as cancelled; their own teardown then finds nothing to do.
        """
        run = self._run
        run.failure_recorded = True
        run.tool_cycle_step = None  # the failure snapshot folds the cycle's request in
        self._end_model_request(error)
        self._settle_in_flight(error)
        if not run.live_messages:
            return  # it failed before its first message: there is no history to keep
        messages = self._failure_history(run.live_messages)
        unanswered = set(unanswered_tool_call_ids(messages))
        for tool_call_id, record in run.completed_calls.items():
            if tool_call_id in unanswered:
                self._queue_discarded(record, step_index=run.step)
        run.completed_calls.clear()
        run.results.clear()
        run.ran.clear()
        self._queue_snapshot(messages, step_index=run.step, reason='failure', skip_if_unchanged=True)

    def _settle_in_flight(self, error: BaseException) -> None:
        """Close the calls still in flight as cancelled by `error` (the failure ended them)."""
        run = self._run
        cancelled = error if isinstance(error, asyncio.CancelledError | RunCancelled) else asyncio.CancelledError()
        for call_id in list(run.active.in_flight):
            self._queue_settle(call_id, step=run.step, error=cancelled)

    def _failure_history(self, live: Sequence[ModelMessage]) -> list[ModelMessage]:
        """The history a failed run leaves: the live one, with what it settled but has not appended yet.

        - The request of a settled tool cycle that no model request has sent yet is folded in, as in
          the tool-cycle snapshot: its returns are settled, and the ledger says so.
        - A response whose stream stopped before its end is still `incomplete` in the history:
          it is recorded as `interrupted`, pydantic-ai's state for a response cut off before the model
          finished, which a later run closes (synthesized returns for its calls) on a new prompt.
        - A response whose calls ran but will never all be answered (a call raised or was
          cancelled) is followed by pydantic-ai's marker of an interrupted tool cycle, a request in
          state `interrupted` holding the returns that did arrive. pydantic-ai appends it as its
          tool cycle unwinds, which may be after this snapshot is taken, so it is added here when
          missing. A later run then closes the other calls with `interrupted` returns instead of
          executing them again: their side effects may have happened.
        """
        run = self._run
        messages = list(live)
        pending = run.pending_request
        if pending is not None and not any(message is pending for message in messages):
            messages.append(pending)
        if not messages or not isinstance(last := messages[-1], ModelResponse):
            return messages
        if last.state == 'incomplete':
            messages[-1] = last = dataclasses.replace(last, state='interrupted')
        unanswered = set(unanswered_tool_call_ids(messages))
        if any(call.tool_call_id in unanswered and call.tool_call_id in run.ran for call in last.tool_calls):
            returned: list[ModelRequestPart] = [
                _return_part(call, run.results[call.tool_call_id])
                for call in last.tool_calls
                if call.tool_call_id in run.results
            ]
            marker = ModelRequest(
                parts=returned, run_id=run.source_run_id, conversation_id=run.conversation_id, state='interrupted'
            )
            messages.append(marker)
        return messages

    def _discard_completed_calls(self) -> None:
        """Record every call completed since the last failure snapshot as discarded: no history will hold its return."""
        run = self._run
        for record in run.completed_calls.values():
            self._queue_discarded(record, step_index=run.step)
        run.completed_calls.clear()
        run.results.clear()

    def _queue_discarded(self, record: ToolEffectRecord, *, step_index: int) -> None:
        """Record a call whose return value never reached the history as failed, with the reason."""
        run = self._run
        if run.ended:
            return
        run.pending.tool_effects.append(
            record.model_copy(update={'status': 'failed', 'effect_summary': _DISCARDED_SUMMARY})
        )
        self._queue_event(
            'tool_call_failed',
            step_index=step_index,
            key=run.key('tool', step_index, record.tool_call_id, 'discarded'),
            tool=record,
            error=_DISCARDED_SUMMARY,
        )

    # --- graph nodes ---

    def _observe(self, ctx: RunContext[Any]) -> _RunState:
        """The run's state, brought up to `ctx`: the run has moved on past the stream of its last model request."""
        run = self._run
        run.live_messages = ctx.messages
        run.step = max(run.step, ctx.run_step)
        run.streamed_output, run.stream_cancelled = None, False
        return run

    async def wrap_node_run(
        self, ctx: RunContext[Any], *, node: AgentNode[Any], handler: WrapNodeRunHandler[Any]
    ) -> NodeResult[Any]:
        self._observe(ctx)
        try:
            return await handler(node)
        except BaseException as error:
            self._observe(ctx)
            self._queue_failure(_described(ctx, error))
            await self._flush(ctx)
            raise

    async def after_node_run(
        self, ctx: RunContext[Any], *, node: AgentNode[Any], result: NodeResult[Any]
    ) -> NodeResult[Any]:
        run = self._observe(ctx)
        run.failure_recorded = False
        if isinstance(node, CallToolsNode) and isinstance(result, ModelRequestNode):
            run.completed_calls.clear()
            run.results.clear()
            run.ran.clear()
            run.pending_request = result.request
            run.tool_cycle_step = ctx.run_step
        elif isinstance(result, End) and isinstance(result.data, FinalResult):
            run.final_result = result.data
        return result

    async def prepare_output_tools(self, ctx: RunContext[Any], tool_defs: list[ToolDefinition]) -> list[ToolDefinition]:
        if self._state is not None:
            self._state.output_tool_names.update(tool_def.name for tool_def in tool_defs)
        return tool_defs

    # --- model requests ---

    async def wrap_model_request(
        self,
        ctx: RunContext[Any],
        *,
        request_context: ModelRequestContext,
        handler: WrapModelRequestHandler,
    ) -> ModelResponse:
        run = self._observe(ctx)
        step = ctx.run_step
        self._end_model_request(None)
        run.open_request, run.stream = step, None
        run.request_streams = request_context.streaming
        run.spans.model_request(step)
        self._queue_tool_cycle(ctx.messages)
        self._queue_event('model_request_started', step_index=step, key=run.key('model', step, 'started'))
        if self.capture_frontier:
            self._queue_snapshot(ctx.messages, step_index=step, reason='before_request')
        await self._flush(ctx)
        try:
            response = await handler(request_context)
        except BaseException as error:
            self._end_model_request(_described(ctx, error))
            await self._flush(ctx)
            raise
        # pydantic-ai's state for a stream its consumer cancelled (a stream left early stays `incomplete`).
        run.stream_cancelled = request_context.streaming and response.state == 'interrupted'
        if run.open_request == step:
            self._end_model_request(_cut_short(response), response)
            if self.capture_frontier:
                self._queue_snapshot([*ctx.messages, response], step_index=step, reason='after_response')
        return response

    def get_wrapper_model(self, model: Model) -> Model | None:
        """`model`, watched for the stream a streamed request of the run opens (`_RunState.stream`).

        Unwrapped outside a run and for a request that is not streamed: the response of one that is
        not streamed reaches `wrap_model_request` from its handler, and no wrapper costs its request anything.
        """
        run = self._state
        if run is None or not run.request_streams:
            return None

        def watch(stream: StreamedResponse) -> None:
            run.stream = stream

        return StreamWatch(model, watch)

    def _queue_tool_cycle(self, live: Sequence[ModelMessage]) -> None:
        """Queue the snapshot of the settled tool cycle, now that its request is in the history and stamped."""
        run = self._run
        step, pending = run.tool_cycle_step, run.pending_request
        if step is None or pending is None:
            return
        run.tool_cycle_step = None
        sent = _position_of(pending, live)
        messages = [*live, pending] if sent is None else list(live[: sent + 1])
        self._queue_snapshot(messages, step_index=step, reason='tool_cycle')

    # --- outputs ---

    async def wrap_output_process(
        self,
        ctx: RunContext[Any],
        *,
        output_context: OutputContext,
        output: Any,
        handler: WrapOutputProcessHandler,
    ) -> Any:
        """Note an output validated whole while its model request still streams (`_RunState.streamed_output`).

        That is `run_stream`'s final response read to its end, whose output the caller then holds, even
        if the caller cancelled the stream first and the run ends without reaching `after_run` (`wrap_run`).
        """
        processed = await handler(output)
        run = self._state
        if run is not None and not ctx.partial_output and run.open_request is not None:
            call = output_context.tool_call
            run.streamed_output = FinalResult(
                processed, None if call is None else call.tool_name, None if call is None else call.tool_call_id
            )
        return processed

    # --- tool calls ---

    async def wrap_tool_execute(
        self,
        ctx: RunContext[Any],
        *,
        call: ToolCallPart,
        tool_def: ToolDefinition,
        args: ValidatedToolArgs,
        handler: WrapToolExecuteHandler,
    ) -> Any:
        run = self._run
        step = ctx.run_step
        run.step = max(run.step, step)
        # A call runs on a response that has arrived. `run_stream` runs the calls of its final
        # response before that model request's handler returns: its response is complete then.
        self._end_model_request(None)
        call_id = call.tool_call_id
        started = ToolEffectRecord(run_id=run.run_id, tool_call_id=call_id, tool_name=call.tool_name, status='started')
        run.active.in_flight[call_id] = started
        run.ran.add(call_id)
        durable = durable_run_of(ctx.run_id)
        if durable is None or call_id not in durable.completed_tool_calls:
            # A call a durable replay returns from its journal completed before: its ledger record never goes
            # back to `started` (its completion is written again, as a fresh run would).
            run.pending.tool_effects.append(started)
        run.spans.tool_started(started, step_index=step)
        self._queue_event(
            'tool_call_started', step_index=step, key=run.key('tool', step, call_id, 'started'), tool=started
        )
        await self._flush(ctx)
        try:
            result = await handler(args)
        except InFlightRefusal as refused:
            self._queue_refused(call_id, step=step, refused=refused)
            await self._flush(ctx)
            raise
        except BaseException as error:
            self._queue_settle(call_id, step=step, error=_described(ctx, error))
            await self._flush(ctx)
            raise
        if self._queue_settle(call_id, step=step, error=None):
            run.results[call_id] = result
        if not run.active.in_flight:
            # No sibling call is running: the completion rides with the next flush (the next model
            # request, tool call or the run's end), which the run reaches without waiting on a
            # model or a tool. A crash before it leaves this call `started` (unknown), never
            # `completed` for a call that did not complete (docs/capability.md, "Durability").
            return result
        try:
            await self._flush(ctx)
        except asyncio.CancelledError:
            # The completed record landed, but the run is discarding this call's result.
            record = run.completed_calls.pop(call_id, None)
            run.results.pop(call_id, None)
            if record is not None:
                self._queue_discarded(record, step_index=step)
                await self._flush(ctx)
            raise
        return result

    def _queue_settle(self, call_id: str, *, step: int, error: BaseException | None) -> bool:
        """Queue the terminal ledger record (keeping annotations) and its event, unless already queued.

        Returns whether it queued them.
        """
        run = self._run
        in_flight = run.active.in_flight.pop(call_id, None)
        if in_flight is None or run.ended:
            return False
        if error is None:
            record = in_flight.model_copy(update={'status': 'completed', 'ended_at': utc_now()})
            run.completed_calls[call_id] = record
        else:
            summary = in_flight.effect_summary if in_flight.effect_summary is not None else _failure_summary(error)
            record = in_flight.model_copy(update={'status': 'failed', 'ended_at': utc_now(), 'effect_summary': summary})
        run.pending.tool_effects.append(record)
        run.spans.tool_settled(record)
        kind: EventKind = 'tool_call_completed' if error is None else 'tool_call_failed'
        outcome = 'completed' if error is None else 'failed'
        self._queue_event(kind, step_index=step, key=run.key('tool', step, call_id, outcome), tool=record, error=error)
        return True

    def _queue_refused(self, call_id: str, *, step: int, refused: InFlightRefusal) -> None:
        """Queue the event ending a call the durable engine refused to run again, and no ledger record: the
        stored one (`started`, with the interrupted run's idempotency key and effect summary) stays the evidence."""
        run = self._run
        in_flight = run.active.in_flight.pop(call_id, None)
        if in_flight is None or run.ended:
            return
        run.spans.tool_settled(in_flight)
        key = run.key('tool', step, call_id, 'failed')
        self._queue_event('tool_call_failed', step_index=step, key=key, tool=in_flight, error=refused)

    # --- specs ---

    @classmethod
    def from_spec(cls, *args: Any, **kwargs: Any) -> StepPersistence[Any]:
        """Build from an agent spec (`Agent.from_spec`) or plain values.

        The store is `store=`: a `StepStore`, a backend name, a URL, or a mapping of
        `step_persistence.from_spec` options; or, in the seed's form, `backend=` (`'memory'`,
        `'file'`, `'sqlite'`, a URL, ...) with the store's own options beside the capability's
        (`directory=`, `database=`, `max_snapshots_per_run=`, ...). An unknown backend raises `ValueError`.
        """
        from step_persistence.spec import from_spec

        store = kwargs.pop('store', None)
        if 'backend' in kwargs:
            if store is not None:
                raise ValueError('give the store as store= or as backend= with its options, not both')
            capability_options = {field.name for field in dataclasses.fields(cls) if field.init}
            own = capability_options & kwargs.keys()
            store_options = {name: value for name, value in kwargs.items() if name not in own}
            kwargs = {name: kwargs[name] for name in own}
            store = from_spec(**store_options)
        if store is not None and not isinstance(store, StepStore):
            kwargs['store'] = from_spec(**store) if isinstance(store, dict) else from_spec(store)
        elif store is not None:
            kwargs['store'] = store
        return cls(*args, **kwargs)
