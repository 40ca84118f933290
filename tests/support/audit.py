"""One audit of everything a persisted run left in a store, called at the end of every capability scenario.

`await audit_run(store, run_id)` reads the run's record, events, snapshots and ledger through the
`StepStore` protocol and checks the invariants that must hold however the run was driven
(`run`, `run_sync`, `run_stream`, `iter`, ...) and however it ended:

- events: one `run_started` first and exactly one terminal event (`run_completed` / `run_failed`)
  last; step indexes never go backwards; every model request and tool call that started has exactly
  one ending event, at its own step, before the terminal one (a call whose completion the run's
  failure discarded gets one `tool_call_failed` correction after its `tool_call_completed`, which
  is then its final status); model requests do not overlap; every `model_request_completed` carries
  the model's name and usage (the scripted models report both), and no event but one ending a model
  request carries either;
- lineage and metadata: every event carries the run record's conversation, parent, agent name and
  metadata;
- ledger: the ledger holds exactly the calls that have events, each with the final status of its
  events and `ended_at` set, and nothing is left `started` in a run that ended in-process;
- snapshots: sequence numbers increase, `state == 'complete'` exactly when the history is
  provider-valid, the newest snapshot holds every tool return an earlier one held, and every call
  the ledger says `completed` has its return in it (none the ledger says `failed` has a successful one);
- recovery: `inspect_recovery` names the same newest snapshot, newest complete snapshot and
  unresolved calls as the reads above;
- continuation: the newest complete snapshot, given to `Agent.run(message_history=...)` of a plain
  agent, is accepted, and the model sees every stored tool return unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, TextPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from step_persistence import (
    ContinuableSnapshot,
    RunRecord,
    StepEvent,
    StepStore,
    ToolEffectRecord,
    inspect_recovery,
    is_provider_valid,
)

__all__ = ['TERMINAL', 'Audit', 'audit_run', 'audit_store', 'returns_in', 'successful_returns']

TERMINAL = ('run_completed', 'run_failed')
_MODEL_ENDINGS = ('model_request_completed', 'model_request_failed')
_TOOL_ENDINGS = ('tool_call_completed', 'tool_call_failed')
_DISCARDED = 'the tool returned, but its result was discarded'


@dataclass
class Audit:
    """What one audited run left in the store, for the scenario's own assertions."""

    run: RunRecord
    events: list[StepEvent]
    snapshots: list[ContinuableSnapshot]
    """Every retained snapshot, any state, in sequence order."""
    effects: dict[str, ToolEffectRecord]
    """Ledger records of the calls that have events, by `tool_call_id`."""
    continued: list[ModelMessage] | None = None
    """What the model was sent when the newest complete snapshot was continued (`None`: not continued)."""
    problems: list[str] = field(default_factory=list[str])

    @property
    def kinds(self) -> list[str]:
        return [event.kind for event in self.events]

    @property
    def terminal(self) -> StepEvent:
        return self.events[-1]

    @property
    def latest(self) -> ContinuableSnapshot | None:
        return self.snapshots[-1] if self.snapshots else None

    @property
    def latest_complete(self) -> ContinuableSnapshot | None:
        return next((s for s in reversed(self.snapshots) if s.state == 'complete'), None)

    def statuses(self) -> dict[str, str]:
        return {call_id: record.status for call_id, record in self.effects.items()}


def successful_returns(messages: Sequence[ModelMessage]) -> dict[str, Any]:
    """`tool_call_id -> content` of the successful tool returns in `messages`."""
    return {
        part.tool_call_id: part.content
        for message in messages
        if isinstance(message, ModelRequest)
        for part in message.parts
        if isinstance(part, ToolReturnPart) and part.outcome == 'success'
    }


def returns_in(messages: Sequence[ModelMessage]) -> dict[str, Any]:
    """`tool_call_id -> content` of every tool return in `messages`, whatever its outcome."""
    return {
        part.tool_call_id: part.content
        for message in messages
        if isinstance(message, ModelRequest)
        for part in message.parts
        if isinstance(part, ToolReturnPart)
    }


def _check_events(audit: Audit, *, ended_in_process: bool) -> dict[str, str]:
    """Event invariants; returns each call's final status as its events say."""
    problems, events, run = audit.problems, audit.events, audit.run
    kinds = audit.kinds
    if not events:
        problems.append('no events')
        return {}
    if kinds[0] != 'run_started' or kinds.count('run_started') != 1:
        problems.append(f'expected one run_started first: {kinds}')
    terminals = [index for index, kind in enumerate(kinds) if kind in TERMINAL]
    if ended_in_process and (len(terminals) != 1 or terminals[0] != len(kinds) - 1):
        problems.append(f'expected exactly one terminal event, last: {kinds}')
    steps = [event.step_index for event in events]
    if steps != sorted(steps):
        problems.append(f'step indexes go backwards: {list(zip(kinds, steps, strict=True))}')

    open_request: int | None = None
    started: dict[str, StepEvent] = {}
    endings: dict[str, list[StepEvent]] = {}
    for index, event in enumerate(events):
        if terminals and index > terminals[0]:
            problems.append(f'{event.kind} after the terminal event')
        if event.kind == 'model_request_started':
            if open_request is not None:
                problems.append(f'model request at step {event.step_index} started while step {open_request} was open')
            open_request = event.step_index
        elif event.kind in _MODEL_ENDINGS:
            if open_request != event.step_index:
                problems.append(f'{event.kind} at step {event.step_index} without its start (open: {open_request})')
            open_request = None
        elif event.kind == 'tool_call_started':
            call_id = event.tool_call_id or ''
            if call_id in started:
                problems.append(f'tool call {call_id} started twice')
            started[call_id] = event
        elif event.kind in _TOOL_ENDINGS:
            call_id = event.tool_call_id or ''
            if call_id not in started:
                problems.append(f'{event.kind} for {call_id} without tool_call_started')
            elif event.step_index != started[call_id].step_index or event.tool_name != started[call_id].tool_name:
                problems.append(f'{event.kind} for {call_id} at another step or under another name')
            endings.setdefault(call_id, []).append(event)
        elif event.kind in TERMINAL:
            if ended_in_process and open_request is not None:
                problems.append(f'{event.kind} while the model request of step {open_request} was open')
            if ended_in_process and set(started) - set(endings):
                problems.append(f'{event.kind} while tool calls were open: {sorted(set(started) - set(endings))}')

    final: dict[str, str] = {}
    for call_id, ends in endings.items():
        kinds_of = [end.kind for end in ends]
        discarded = kinds_of == ['tool_call_completed', 'tool_call_failed'] and _DISCARDED in (ends[1].error or '')
        if len(ends) != 1 and not discarded:
            problems.append(f'tool call {call_id} has {len(ends)} ending events: {kinds_of}')
        final[call_id] = 'completed' if ends[-1].kind == 'tool_call_completed' else 'failed'

    for event in events:
        if event.kind == 'model_request_completed' and (event.model_name is None or event.usage is None):
            problems.append(f'model_request_completed at step {event.step_index} without its model name or usage')
        if event.kind not in _MODEL_ENDINGS and (event.model_name is not None or event.usage is not None):
            problems.append(f'{event.kind} at step {event.step_index} carries a model name or usage')
        lineage = (event.run_id, event.conversation_id, event.parent_run_id, event.agent_name, event.metadata)
        expected = (run.run_id, run.conversation_id, run.parent_run_id, run.agent_name, run.metadata)
        if lineage != expected:
            problems.append(f'{event.kind} carries {lineage}, the run {expected}')
    return final


async def _check_ledger(audit: Audit, store: StepStore, final: dict[str, str], *, ended_in_process: bool) -> None:
    problems = audit.problems
    for call_id, status in final.items():
        record = audit.effects.get(call_id)
        if record is None:
            problems.append(f'tool call {call_id} has events but no ledger record')
            continue
        if record.status != status:
            problems.append(f'ledger says {call_id} {record.status}, its events {status}')
        if record.ended_at is None or record.ended_at < record.started_at:
            problems.append(f'ledger record of {call_id} has ended_at {record.ended_at}')
        if record.status == 'failed' and not record.effect_summary:
            problems.append(f'failed ledger record of {call_id} has no summary')
    ledger = {record.tool_call_id for record in await store.list_tool_effects(run_id=audit.run.run_id)}
    if ledger != set(audit.effects):
        problems.append(f'the ledger holds {sorted(ledger)}, the calls with events are {sorted(audit.effects)}')
    unresolved = await store.list_unresolved_tool_effects(run_id=audit.run.run_id)
    if ended_in_process and unresolved:
        problems.append(f'records left started: {[record.tool_call_id for record in unresolved]}')


async def _check_snapshots(audit: Audit, store: StepStore) -> None:
    problems, snapshots, run_id = audit.problems, audit.snapshots, audit.run.run_id
    seqs = [snapshot.seq for snapshot in snapshots]
    if None in seqs or seqs != sorted(set(seqs), key=lambda seq: seq or 0):
        problems.append(f'snapshot sequence numbers do not increase: {seqs}')
    steps = [snapshot.step_index for snapshot in snapshots]
    if steps != sorted(steps):
        problems.append(f'snapshot step indexes go backwards: {steps}')
    for snapshot in snapshots:
        if not snapshot.messages:
            problems.append(f'snapshot {snapshot.seq} holds no messages')
        if (snapshot.state == 'complete') != is_provider_valid(snapshot.messages):
            problems.append(f'snapshot {snapshot.seq} is {snapshot.state} but provider-valid is the opposite')
    if not snapshots:
        return
    newest = successful_returns(snapshots[-1].messages)
    for snapshot in snapshots[:-1]:
        lost = set(successful_returns(snapshot.messages)) - set(newest)
        if lost:
            problems.append(f'the newest snapshot lost tool returns that snapshot {snapshot.seq} held: {sorted(lost)}')
    for call_id, record in audit.effects.items():
        if record.status == 'completed' and call_id not in newest:
            problems.append(f'ledger says {call_id} completed, the newest snapshot has no return for it')
        if record.status == 'failed' and call_id in newest:
            problems.append(f'ledger says {call_id} failed, the newest snapshot has its successful return')
    if await store.latest_snapshot(run_id=run_id, include_interrupted=True) != snapshots[-1]:
        problems.append('latest_snapshot(include_interrupted=True) is not the last listed snapshot')
    if await store.latest_snapshot(run_id=run_id) != audit.latest_complete:
        problems.append('latest_snapshot() is not the newest complete snapshot')


async def _check_recovery(audit: Audit, store: StepStore) -> None:
    report = await inspect_recovery(store, run_id=audit.run.run_id)
    if report.latest_snapshot != audit.latest or report.latest_complete_snapshot != audit.latest_complete:
        audit.problems.append('inspect_recovery names other snapshots than the newest and the newest complete')
    unresolved = await store.list_unresolved_tool_effects(run_id=audit.run.run_id)
    if report.unresolved_effects != unresolved:
        audit.problems.append('inspect_recovery names other unresolved calls than the ledger')


async def _check_continuation(audit: Audit) -> None:
    snapshot = audit.latest_complete
    if snapshot is None:
        return
    seen: list[list[ModelMessage]] = []

    def probe(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        seen.append(list(messages))
        return ModelResponse(parts=[TextPart('continued')])

    history = snapshot.messages
    prompt = None if isinstance(history[-1], ModelRequest) else 'continue'
    result = await Agent(FunctionModel(probe)).run(prompt, message_history=history)
    if result.output != 'continued' or not seen:
        audit.problems.append('the newest complete snapshot did not continue')
        return
    audit.continued = seen[0]
    sent = returns_in(seen[0])
    for call_id, content in returns_in(history).items():
        if call_id not in sent or sent[call_id] != content:
            audit.problems.append(f'the model was not sent the stored return of {call_id} unchanged')


async def audit_run(store: StepStore, run_id: str, *, ended_in_process: bool = True, continues: bool = True) -> Audit:
    """Audit one run; fails with every problem found. `continues=False` skips the continuation check."""
    run = await store.get_run(run_id=run_id)
    assert run is not None, f'run {run_id!r} is not stored'
    events = await store.list_events(run_id=run_id)
    effects: dict[str, ToolEffectRecord] = {}
    for event in events:
        if event.tool_call_id is not None and event.tool_call_id not in effects:
            record = await store.get_tool_effect(run_id=run_id, tool_call_id=event.tool_call_id)
            if record is not None:
                effects[event.tool_call_id] = record
    snapshots = await store.list_snapshots(run_id=run_id, include_interrupted=True)
    audit = Audit(run=run, events=events, snapshots=snapshots, effects=effects)
    final = _check_events(audit, ended_in_process=ended_in_process)
    await _check_ledger(audit, store, final, ended_in_process=ended_in_process)
    await _check_snapshots(audit, store)
    await _check_recovery(audit, store)
    if continues and not audit.problems:
        await _check_continuation(audit)
    assert not audit.problems, f'run {run_id}:\n  ' + '\n  '.join(audit.problems)
    return audit


async def audit_store(store: StepStore, **options: Any) -> list[Audit]:
    """`audit_run` on every run of the store, oldest first."""
    return [await audit_run(store, run.run_id, **options) for run in await store.list_runs()]
