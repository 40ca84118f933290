"""A workflow's initial message history, recorded so that `recover_abandoned` can start its run again.

`WorkflowRecord.inputs['history']` says where the history is: `None` (the run had none),
`{'snapshot': {'kind', 'run_id', 'seq'}}` (the stored snapshot it continues or forks, found as
`StepPersistence` finds a run's origin: nothing is stored twice), or `{'unit': HISTORY_UNIT}` (a
history no store has, journaled once as a completed unit of the workflow, in the store's message
encoding with its media in the store's media store, as a unit's result is).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from pydantic_ai.messages import ModelMessage, ModelMessagesTypeAdapter

from step_persistence._history import encode_messages
from step_persistence.durable.protocol import JournalStore
from step_persistence.durable.records import DurableUnit, Fence, WorkflowRecord
from step_persistence.origins import find_origin, tag_history
from step_persistence.protocol import StepStore
from step_persistence.records import OriginKind, utc_now
from step_persistence.stores._media import MessageMedia

__all__ = ['HISTORY_UNIT', 'HistoryUnavailable', 'history_reference', 'journal_history', 'read_history']

HISTORY_UNIT = 'step_persistence:initial_history#run#0'
"""The key of the unit holding a workflow's initial history when no stored snapshot has it."""


class HistoryUnavailable(LookupError):
    """A workflow's initial history cannot be read back (not recorded, or its snapshot is no longer retained)."""


async def history_reference(store: StepStore, messages: Sequence[ModelMessage]) -> dict[str, Any] | None:
    """`inputs['history']` for a run starting from `messages`: the snapshot they came from, or the unit."""
    if not messages:
        return None
    origin = await find_origin(store, messages, encode_messages(messages), conversation_id=None)
    if origin is None:
        return {'unit': HISTORY_UNIT}
    return {'snapshot': {'kind': origin.kind, 'run_id': origin.run_id, 'seq': origin.seq}}


async def journal_history(
    journal: JournalStore, media: MessageMedia, workflow_id: str, messages: Sequence[ModelMessage], fence: Fence
) -> None:
    """Journal `messages` as the workflow's `HISTORY_UNIT` (completed: a replay never runs it)."""
    tree = [json.loads(encoded.data) for encoded in encode_messages(messages)]
    payload, externalized = await media.pack_changed(tree)
    unit = DurableUnit(
        workflow_id=workflow_id,
        unit_key=HISTORY_UNIT,
        name=HISTORY_UNIT.split('#', 1)[0],
        kind='other',
        status='completed',
        result=payload,
        externalized=externalized,
        ended_at=utc_now(),
    )
    await journal.record_unit(unit, fence=fence)


async def read_history(
    store: StepStore, journal: JournalStore, media: MessageMedia, record: WorkflowRecord
) -> list[ModelMessage] | None:
    """The initial history `record`'s run started from (`None`: it had none or none was recorded), as
    `history_reference` recorded it: compare the run's inputs fingerprint to know which.

    A history read from a snapshot is tagged with its origin, so the resumed run's record keeps the same
    one. `HistoryUnavailable` when it cannot be read.
    """
    where = record.inputs.get('history')  # absent in a workflow recorded before histories were
    if where is None:
        return None
    if not isinstance(where, dict):
        raise HistoryUnavailable(f'its recorded history is damaged: {where!r}')
    snapshot = where.get('snapshot')
    if isinstance(snapshot, dict):
        return await _from_snapshot(store, snapshot)
    units = {unit.unit_key: unit for unit in await journal.list_units(workflow_id=record.workflow_id)}
    unit = units.get(HISTORY_UNIT)
    if where.get('unit') != HISTORY_UNIT or unit is None or unit.status != 'completed':
        raise HistoryUnavailable('its initial message history was not journaled (its run stopped first)')
    tree = await media.unpack(unit.result, externalized=unit.externalized)
    return ModelMessagesTypeAdapter.validate_python(tree)


async def _from_snapshot(store: StepStore, reference: dict[str, Any]) -> list[ModelMessage]:
    run_id, seq, kind = reference.get('run_id'), reference.get('seq'), reference.get('kind')
    if not isinstance(run_id, str) or not isinstance(seq, int) or kind not in ('continued', 'forked'):
        raise HistoryUnavailable(f'its recorded history reference is damaged: {reference!r}')
    origin_kind: OriginKind = 'continued' if kind == 'continued' else 'forked'
    for snapshot in await store.list_snapshots(run_id=run_id, include_interrupted=True):
        if snapshot.seq == seq:
            return tag_history(list(snapshot.messages), kind=origin_kind, run_id=run_id, seq=seq)
    raise HistoryUnavailable(f'its initial history is snapshot {seq} of run {run_id!r}, which is no longer retained')
