"""A workflow's inputs beyond a text prompt, recorded so that `recover_abandoned` can start its run again.

`WorkflowRecord.inputs['history']` says where the initial message history is: `None` (the run had
none), `{'snapshot': {'kind', 'run_id', 'seq'}}` (the stored snapshot it continues or forks, found
as `StepPersistence` finds a run's origin: nothing is stored twice), or `{'unit': HISTORY_UNIT}` (a
history no store has, journaled once as a completed unit of the workflow). A prompt that is not
text (content parts: images, documents) is journaled as `PROMPT_UNIT` (`inputs['prompt']` is then
`{'unit': PROMPT_UNIT}`), a user prompt message. Both units are in the store's message encoding,
their media in the store's media store, as a unit's result is.

`inputs['deferred_tool_results']` is `{'unit': DEFERRED_UNIT}` for a run whose history ends in tool
calls (the only history pydantic-ai takes `deferred_tool_results` with), else `None`. The run
journals that unit when it starts (its first node: the results are not known before), holding the
`DeferredToolResults` it was given in pydantic-ai's JSON form, `None` without; its fingerprint is
the digest of that form, and a replay given other results (or none) is refused.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic_ai.durable_exec import JSON_CODEC
from pydantic_ai.messages import (
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelRequest,
    ModelResponse,
    UserContent,
    UserPromptPart,
)
from pydantic_ai.tools import DeferredToolApprovalResult, DeferredToolCallResult, DeferredToolResults

from step_persistence._cancellation import run_to_completion
from step_persistence._history import encode_messages
from step_persistence.durable.errors import ReplayDivergedError
from step_persistence.durable.fingerprints import digest
from step_persistence.durable.protocol import JournalStore
from step_persistence.durable.records import DurableUnit, Fence, WorkflowRecord
from step_persistence.durable.workflow import ActiveWorkflow
from step_persistence.origins import find_origin, tag_history
from step_persistence.protocol import StepStore
from step_persistence.records import OriginKind, utc_now
from step_persistence.stores._media import MessageMedia

__all__ = [
    'DEFERRED_UNIT',
    'HISTORY_UNIT',
    'PROMPT_UNIT',
    'InputsUnavailable',
    'RunInputs',
    'journal_deferred_results',
    'journal_inputs',
    'read_inputs',
    'recorded_inputs',
]

HISTORY_UNIT = 'step_persistence:initial_history#run#0'
"""The key of the unit holding a workflow's initial history when no stored snapshot has it."""

PROMPT_UNIT = 'step_persistence:prompt#run#0'
"""The key of the unit holding a workflow's prompt when it is not text."""

DEFERRED_UNIT = 'step_persistence:deferred_tool_results#run#0'
"""The key of the unit holding the `deferred_tool_results` a workflow's run was given (`None` if none)."""

Prompt = str | Sequence[UserContent] | None


@dataclass(frozen=True)
class RunInputs:
    """What a workflow's run was started with, read back for `recover_abandoned`."""

    prompt: Prompt
    history: list[ModelMessage] | None
    deferred_tool_results: DeferredToolResults | None


class InputsUnavailable(LookupError):
    """A workflow's inputs cannot be read back (not journaled, or its history's snapshot is no longer retained)."""


async def recorded_inputs(store: StepStore, prompt: Prompt, messages: Sequence[ModelMessage]) -> dict[str, Any]:
    """`inputs['prompt']` and `inputs['history']` for a run started with `prompt` from `messages`."""
    history: dict[str, Any] | None = None
    if messages:
        origin = await find_origin(store, messages, encode_messages(messages), conversation_id=None)
        history = (
            {'unit': HISTORY_UNIT}
            if origin is None
            else {'snapshot': {'kind': origin.kind, 'run_id': origin.run_id, 'seq': origin.seq}}
        )
    recorded_prompt = prompt if prompt is None or isinstance(prompt, str) else {'unit': PROMPT_UNIT}
    deferred = {'unit': DEFERRED_UNIT} if _ends_in_tool_calls(messages) else None
    return {'prompt': recorded_prompt, 'history': history, 'deferred_tool_results': deferred}


def _ends_in_tool_calls(messages: Sequence[ModelMessage]) -> bool:
    """Whether the newest response of `messages`, with the responses right before it (pydantic-ai merges adjacent
    ones), calls a tool: pydantic-ai takes `deferred_tool_results` only for such a history."""
    responses = 0
    for message in reversed(messages):
        if isinstance(message, ModelResponse):
            responses += 1
            if message.tool_calls:
                return True
        elif responses:
            return False
    return False


async def journal_inputs(
    journal: JournalStore,
    media: MessageMedia,
    record: WorkflowRecord,
    units: Sequence[DurableUnit],
    prompt: Prompt,
    messages: Sequence[ModelMessage],
    fence: Fence,
) -> None:
    """Journal the units `record`'s inputs refer to and `units` (those stored) lack: once per workflow."""
    stored = {unit.unit_key for unit in units}
    pending: list[tuple[str, Sequence[ModelMessage]]] = []
    if _refers_to(record.inputs.get('history'), HISTORY_UNIT):
        pending.append((HISTORY_UNIT, messages))
    if _refers_to(record.inputs.get('prompt'), PROMPT_UNIT) and prompt is not None and not isinstance(prompt, str):
        pending.append((PROMPT_UNIT, [ModelRequest(parts=[UserPromptPart(list(prompt))])]))
    for key, journaled in pending:
        if key in stored:
            continue
        tree = [json.loads(encoded.data) for encoded in encode_messages(journaled)]
        payload, externalized = await media.pack_changed(tree)
        await journal.record_unit(_input_unit(record.workflow_id, key, payload, externalized), fence=fence)


def _input_unit(
    workflow_id: str, key: str, payload: Any, externalized: bool, *, fingerprint: str | None = None
) -> DurableUnit:
    """The completed unit under `key` that holds one of a workflow's inputs (`payload`, packed)."""
    return DurableUnit(
        workflow_id=workflow_id,
        unit_key=key,
        name=key.split('#', 1)[0],
        kind='other',
        status='completed',
        fingerprint=fingerprint,
        result=payload,
        externalized=externalized,
        ended_at=utc_now(),
    )


async def journal_deferred_results(workflow: ActiveWorkflow, results: DeferredToolResults | None) -> None:
    """Journal the `deferred_tool_results` the workflow's run was given, if its inputs refer to them (once); a
    replay given other results, or none where they were given, raises `ReplayDivergedError`."""
    if not _refers_to(workflow.record.inputs.get('deferred_tool_results'), DEFERRED_UNIT):
        return  # a history pydantic-ai takes no results with: it refuses any given
    payload = None if results is None else _encode_results(results)
    fingerprint = digest(payload)
    stored = workflow.stored.get(DEFERRED_UNIT)
    if stored is not None and stored.status == 'completed':
        if stored.fingerprint != fingerprint:
            if results is None:
                what = 'the run was given no deferred_tool_results, and was journaled with some'
            elif stored.fingerprint == digest(None):
                what = 'the run was given deferred_tool_results, and was journaled without'
            else:
                what = 'the run was given other deferred_tool_results than those journaled'
            raise ReplayDivergedError(workflow_id=workflow.workflow_id, unit_key=DEFERRED_UNIT, what=what)
        return
    packed, externalized = await workflow.media.pack_changed(payload)
    unit = _input_unit(workflow.workflow_id, DEFERRED_UNIT, packed, externalized, fingerprint=fingerprint)
    fence = None if workflow.lease is None else workflow.lease.fence
    await run_to_completion(workflow.journal.record_unit(unit, fence=fence))


def _encode_results(results: DeferredToolResults) -> dict[str, Any]:
    """`results` as JSON, each approval and call result in the form pydantic-ai gives it to the tool (`True` as
    `ToolApproved()`, a plain value as `ToolReturn(value)`), so that it is read back as the same type."""
    approvals = DeferredToolResults(approvals=results.approvals).to_tool_call_results()
    calls = DeferredToolResults(calls=results.calls).to_tool_call_results()
    return {
        'approvals': JSON_CODEC.dump(dict[str, DeferredToolApprovalResult], approvals),
        'calls': JSON_CODEC.dump(dict[str, DeferredToolCallResult], calls),
        'metadata': JSON_CODEC.dump(dict[str, dict[str, Any]], results.metadata),
        'answered_by': dict(results.answered_by),
    }


def _decode_results(payload: Any) -> DeferredToolResults:
    if not isinstance(payload, dict):
        raise ValueError(f'not an object: {payload!r}')
    return DeferredToolResults(
        approvals=JSON_CODEC.load(dict[str, DeferredToolApprovalResult], payload.get('approvals', {})),
        calls=JSON_CODEC.load(dict[str, DeferredToolCallResult], payload.get('calls', {})),
        metadata=JSON_CODEC.load(dict[str, dict[str, Any]], payload.get('metadata', {})),
        answered_by=JSON_CODEC.load(dict[str, str], payload.get('answered_by', {})),
    )


async def read_inputs(
    store: StepStore, journal: JournalStore, media: MessageMedia, record: WorkflowRecord
) -> RunInputs:
    """The prompt, initial history and deferred tool results `record`'s run started with, as recorded.

    A workflow recorded before histories were has none here: compare the run's inputs fingerprint to
    know whether that is what it ran with. A history read from a snapshot is tagged with its origin,
    so the resumed run's record keeps the same one. `InputsUnavailable` when they cannot be read.
    """
    prompt, where = record.inputs.get('prompt'), record.inputs.get('history')
    deferred = record.inputs.get('deferred_tool_results')
    units: Mapping[str, DurableUnit] = {}
    if any(_refers_to(*each) for each in ((prompt, PROMPT_UNIT), (where, HISTORY_UNIT), (deferred, DEFERRED_UNIT))):
        units = {unit.unit_key: unit for unit in await journal.list_units(workflow_id=record.workflow_id)}
    results = None
    if _refers_to(deferred, DEFERRED_UNIT):
        results = await _journaled_results(units, media)
    elif deferred is not None:
        raise InputsUnavailable(f'its recorded deferred tool results are damaged: {deferred!r}')
    if _refers_to(prompt, PROMPT_UNIT):
        journaled = await _journaled(units, PROMPT_UNIT, media, 'its prompt')
        request = journaled[0] if len(journaled) == 1 else None
        part = request.parts[0] if isinstance(request, ModelRequest) and len(request.parts) == 1 else None
        if not isinstance(part, UserPromptPart) or isinstance(part.content, str):
            raise InputsUnavailable('its journaled prompt is damaged')
        prompt = list(part.content)
    elif prompt is not None and not isinstance(prompt, str):
        raise InputsUnavailable(f'its recorded prompt is damaged: {prompt!r}')
    if where is None:
        return RunInputs(prompt, None, results)
    if not isinstance(where, dict):
        raise InputsUnavailable(f'its recorded history is damaged: {where!r}')
    snapshot = where.get('snapshot')
    if isinstance(snapshot, dict):
        return RunInputs(prompt, await _from_snapshot(store, snapshot), results)
    if not _refers_to(where, HISTORY_UNIT):
        raise InputsUnavailable(f'its recorded history is damaged: {where!r}')
    return RunInputs(prompt, await _journaled(units, HISTORY_UNIT, media, 'its initial message history'), results)


def _refers_to(recorded: object, key: str) -> bool:
    return isinstance(recorded, dict) and recorded.get('unit') == key


async def _journaled(units: Mapping[str, DurableUnit], key: str, media: MessageMedia, what: str) -> list[ModelMessage]:
    unit = units.get(key)
    if unit is None or unit.status != 'completed':
        raise InputsUnavailable(f'{what} was not journaled (its run stopped first)')
    try:
        tree = await media.unpack(unit.result, externalized=unit.externalized)
        return ModelMessagesTypeAdapter.validate_python(tree)
    except ValueError as error:  # damaged, or its media in a media store this store was opened without
        raise InputsUnavailable(f'{what} cannot be read back: {error}') from error


async def _journaled_results(units: Mapping[str, DurableUnit], media: MessageMedia) -> DeferredToolResults | None:
    unit = units.get(DEFERRED_UNIT)
    if unit is None or unit.status != 'completed':
        raise InputsUnavailable('its deferred tool results were not journaled (its run stopped first)')
    try:
        payload = await media.unpack(unit.result, externalized=unit.externalized)
        return None if payload is None else _decode_results(payload)
    except ValueError as error:  # damaged, or its media in a media store this store was opened without
        raise InputsUnavailable(f'its deferred tool results cannot be read back: {error}') from error


async def _from_snapshot(store: StepStore, reference: dict[str, Any]) -> list[ModelMessage]:
    run_id, seq, kind = reference.get('run_id'), reference.get('seq'), reference.get('kind')
    if not isinstance(run_id, str) or not isinstance(seq, int) or kind not in ('continued', 'forked'):
        raise InputsUnavailable(f'its recorded history reference is damaged: {reference!r}')
    origin_kind: OriginKind = 'continued' if kind == 'continued' else 'forked'
    for snapshot in await store.list_snapshots(run_id=run_id, include_interrupted=True):
        if snapshot.seq == seq:
            return tag_history(list(snapshot.messages), kind=origin_kind, run_id=run_id, seq=seq)
    raise InputsUnavailable(f'its initial history is snapshot {seq} of run {run_id!r}, which is no longer retained')
