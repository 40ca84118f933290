"""FileStepStore: one field of one line or file set to a hostile value (or removed) never hides the rest.

`test_corruption.py` writes random bytes, which mostly breaks a line's JSON. This goes one field at a
time through every file of a run (`run.json`, `registration.json`, `events.jsonl`,
`tool_effects.jsonl`, `snapshots.jsonl`, `snapshots/<seq>.json`, and its history line's
`messages.jsonl`; and `run.json` as runs registered before issue 19 spell it, wrapping the record
and its stamp), with values the store would never write:
after the damage every listing still works, the healthy records of the run are all there, what was
skipped was logged, `get_*` return a record or raise `ValueError`, later writes to the run work, and
another run of the store reads back unchanged.
"""

from __future__ import annotations

import contextlib
import json
import logging
from pathlib import Path
from typing import Any

import pytest

from step_persistence import ContinuableSnapshot, FileStepStore, RunRecord, StepEvent, TokenUsage, ToolEffectRecord
from step_persistence.testing.conformance import sample_history
from support.reliability_helpers import write_sentinel

pytestmark = pytest.mark.anyio

REMOVED = object()
HOSTILE: list[Any] = [
    REMOVED,
    None,
    'tomorrow',
    '2026-01-01T00:00:00',  # a naive time
    -1,
    2**70,
    True,
    [],
    {'$ne': None},
    'x' * 5000,
]
"""Values none of the store's fields holds as written (`REMOVED`: the field is left out)."""


USAGE = TokenUsage(input_tokens=10, output_tokens=2, cache_read_tokens=0, cache_write_tokens=0)
"""The usage of the victim's model request (line 1 of its `events.jsonl`)."""


def hostile_id(value: Any) -> str:
    return 'removed' if value is REMOVED else repr(value)[:20]


async def write_victim(store: FileStepStore) -> None:
    await store.register_run(RunRecord(run_id='victim', agent_name='a', metadata={'role': 'victim'}))
    for step, kind in enumerate(('run_started', 'model_request_completed', 'run_completed')):
        answered = {'model_name': 'm', 'usage': USAGE} if kind == 'model_request_completed' else {}
        event = StepEvent(run_id='victim', kind=kind, step_index=step, metadata={'n': str(step)}, **answered)
        await store.append_event(event)
    for step in (1, 2, 3):
        state = 'interrupted' if step == 2 else 'complete'
        messages = sample_history(step, tag='victim')
        await store.save_snapshot(ContinuableSnapshot(run_id='victim', step_index=step, messages=messages, state=state))
    for call_id, status in (('a', 'started'), ('b', 'completed')):
        await store.record_tool_effect(
            ToolEffectRecord(run_id='victim', tool_call_id=call_id, tool_name='t', status=status)
        )


def messages_of(root: Path, run_id: str) -> Path:
    """The `messages.jsonl` of the history line the run's newest snapshot is on."""
    newest = json.loads((root / run_id / 'snapshots.jsonl').read_bytes().splitlines()[-1])
    return root / '@lines' / newest['view']['line'] / 'messages.jsonl'


def set_field(value: dict[str, Any], path: tuple[str, ...], new: Any) -> None:
    *parents, name = path
    for parent in parents:
        value = value[parent]
    if new is REMOVED:
        value.pop(name, None)
    else:
        value[name] = new


def damage_line(path: Path, index: int, field: tuple[str, ...], new: Any) -> None:
    lines = path.read_bytes().split(b'\n')
    value = json.loads(lines[index])
    set_field(value, field, new)
    lines[index] = json.dumps(value, ensure_ascii=False, separators=(',', ':')).encode()
    path.write_bytes(b'\n'.join(lines))


def damage_file(path: Path, field: tuple[str, ...], new: Any) -> None:
    value = json.loads(path.read_bytes())
    set_field(value, field, new)
    path.write_text(json.dumps(value, ensure_ascii=False, indent=2))


RUN_FIELDS = [  # a run_id naming another run makes the directory foreign: test_file_hostile.py
    ('started_at',),
    ('agent_name',),
    ('conversation_id',),
    ('parent_run_id',),
    ('metadata',),
    ('origin',),
]
REGISTRATION_FIELDS = [('registered_ns',)]
WRAPPED_RUN_FIELDS = [
    ('run', 'started_at'),
    ('run', 'agent_name'),
    ('run', 'conversation_id'),
    ('run', 'parent_run_id'),
    ('run', 'metadata'),
    ('run',),
    ('registered_ns',),
]
EVENT_FIELDS = [
    ('run_id',),
    ('kind',),
    ('step_index',),
    ('timestamp',),
    ('idempotency_key',),
    ('metadata',),
    ('model_name',),
    ('usage',),
    ('usage', 'input_tokens'),
    ('usage', 'cache_write_tokens'),
]
EFFECT_FIELDS = [('run_id',), ('tool_call_id',), ('tool_name',), ('status',), ('started_at',), ('ended_at',)]
JOURNAL_FIELDS = [('seq',), ('state',), ('idempotency_key',), ('retain',), ('step_index',)]
SNAPSHOT_FIELDS = [
    ('seq',),
    ('run_id',),
    ('state',),
    ('step_index',),
    ('timestamp',),
    ('history',),
    ('history', 'length'),
    ('history', 'through_message'),
    ('history', 'checksum'),
]
MESSAGE_FIELDS = [('no',), ('pos',), ('digest',), ('externalized',), ('message',), ('message', 'parts')]

WRAPPED = 'run.json (wrapped)'
"""`run.json` as written before issue 19: `{"run": <record>, "registered_ns": <stamp>}`, no `registration.json`."""


def wrap_run_file(run_directory: Path) -> None:
    """Spell the run's record as a store before issue 19 did."""
    record = json.loads((run_directory / 'run.json').read_bytes())
    registration = run_directory / 'registration.json'
    stamp = json.loads(registration.read_bytes())['registered_ns']
    (run_directory / 'run.json').write_text(json.dumps({'run': record, 'registered_ns': stamp}, indent=2))
    registration.unlink()


CASES = [
    pytest.param(name, line, field, id=f'{name}:{".".join(field)}')
    for name, line, fields in (
        ('run.json', None, RUN_FIELDS),
        ('registration.json', None, REGISTRATION_FIELDS),
        (WRAPPED, None, WRAPPED_RUN_FIELDS),
        ('events.jsonl', 1, EVENT_FIELDS),
        ('tool_effects.jsonl', 1, EFFECT_FIELDS),
        ('snapshots.jsonl', 1, JOURNAL_FIELDS),
        ('snapshots/2.json', None, SNAPSHOT_FIELDS),
        ('messages.jsonl', -2, MESSAGE_FIELDS),  # the last message line: snapshot 3's only
    )
    for field in fields
]


@pytest.fixture
def logged(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.WARNING, logger='step_persistence')
    return caplog


@pytest.mark.parametrize(('name', 'line', 'field'), CASES)
@pytest.mark.parametrize('new', HOSTILE, ids=hostile_id)
async def test_one_damaged_field_never_hides_the_rest(
    tmp_path: Path, logged: pytest.LogCaptureFixture, name: str, line: int | None, field: tuple[str, ...], new: Any
) -> None:
    writer = FileStepStore(tmp_path, fsync=False)
    unchanged = await write_sentinel(writer)
    await write_victim(writer)
    if name == WRAPPED:
        wrap_run_file(tmp_path / 'victim')
        name = 'run.json'
    path = messages_of(tmp_path, 'victim') if name == 'messages.jsonl' else tmp_path / 'victim' / name
    if line is None:
        damage_file(path, field, new)
    else:
        damage_line(path, line, field, new)
    logged.clear()

    store = FileStepStore(tmp_path, fsync=False)
    listed = [run.run_id for run in await store.list_runs()]
    assert 'sentinel' in listed
    try:
        await store.get_run(run_id='victim')
    except ValueError:
        assert 'victim' not in listed
    events = [event.step_index for event in await store.list_events(run_id='victim')]
    effects = {effect.tool_call_id for effect in await store.list_tool_effects(run_id='victim')}
    await store.list_unresolved_tool_effects(run_id='victim')
    for call_id in ('a', 'b'):
        with contextlib.suppress(ValueError):
            await store.get_tool_effect(run_id='victim', tool_call_id=call_id)
    seqs = [snapshot.seq for snapshot in await store.list_snapshots(run_id='victim', include_interrupted=True)]
    await store.latest_snapshot(run_id='victim')
    await store.list_snapshot_states(run_id='victim')

    healthy_events = [0, 2] if name == 'events.jsonl' else [0, 1, 2]
    assert [step for step in events if step in healthy_events] == healthy_events
    assert effects >= ({'a'} if name == 'tool_effects.jsonl' else {'a', 'b'})
    healthy_seqs = {'snapshots.jsonl': [1, 3], 'snapshots/2.json': [1, 3], 'messages.jsonl': [1, 2]}.get(
        name, [1, 2, 3]
    )
    assert [seq for seq in seqs if seq in healthy_seqs] == healthy_seqs
    if len(events) < 3 or len(effects) < 2 or len(seqs) < 3 or 'victim' not in listed:
        assert logged.records, 'what a listing skipped was logged'

    await store.append_event(StepEvent(run_id='victim', kind='run_started', step_index=9))
    await store.record_tool_effect(ToolEffectRecord(run_id='victim', tool_call_id='c', tool_name='t', status='started'))
    await store.save_snapshot(
        ContinuableSnapshot(run_id='victim', step_index=9, messages=sample_history(4, tag='victim'))
    )
    reader = FileStepStore(tmp_path, fsync=False)
    assert 9 in [event.step_index for event in await reader.list_events(run_id='victim')]
    assert await reader.get_tool_effect(run_id='victim', tool_call_id='c') is not None
    latest = await reader.latest_snapshot(run_id='victim')
    assert latest is not None and latest.step_index == 9
    await unchanged()
