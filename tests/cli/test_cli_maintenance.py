"""`step-persistence prune` and `gc` run as a console script against every durable store kind."""

from __future__ import annotations

import json
import random
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import pytest
from pydantic_ai.messages import BinaryContent, ModelRequest, UserPromptPart

from cli.test_cli_inspect import store_url
from step_persistence import ContinuableSnapshot, RunRecord, StepEvent, StepStore, from_spec
from step_persistence.records import EventKind, utc_now
from support.backends import BACKENDS, BackendSession, spec_of
from support.console_script import cli

pytestmark = pytest.mark.anyio

PICTURE = random.Random(11).randbytes(100 * 1024)
"""Above the media threshold: a blob only the old failed run refers to."""


@pytest.fixture(params=['file', 'sqlite', 'postgres', 'mongo'])
async def session(request: pytest.FixtureRequest) -> AsyncIterator[BackendSession]:
    async with BACKENDS[request.param].open(request) as opened:
        yield opened


async def _run(
    store: StepStore, run_id: str, age: timedelta, *kinds: EventKind, last_event_age: timedelta | None = None
) -> None:
    started = utc_now() - age
    await store.register_run(RunRecord(run_id=run_id, agent_name='worker', started_at=started))
    for step, kind in enumerate(kinds):
        when = started if last_event_age is None or step < len(kinds) - 1 else utc_now() - last_event_age
        await store.append_event(StepEvent(run_id=run_id, kind=kind, step_index=step, timestamp=when))


async def write_runs(spec: dict[str, Any]) -> None:
    """Old runs of every status (oldest first), one new run; the old failed run holds a picture."""
    async with from_spec(**spec) as store:
        await _run(store, 'old-completed', timedelta(days=44), 'run_started', 'run_completed')
        await _run(store, 'old-failed', timedelta(days=43), 'run_started', 'run_failed')
        picture = ModelRequest(parts=[UserPromptPart(['look', BinaryContent(data=PICTURE, media_type='image/png')])])
        await store.save_snapshot(ContinuableSnapshot(run_id='old-failed', step_index=1, messages=[picture]))
        await _run(store, 'old-crashed', timedelta(days=42), 'run_started', 'model_request_started')
        await _run(
            store, 'old-running', timedelta(days=41), 'run_started', 'model_request_started', last_event_age=timedelta()
        )
        await _run(store, 'new-completed', timedelta(days=1), 'run_started', 'run_completed')


def prune(store: str, *args: str) -> list[str]:
    report = json.loads(cli('prune', '--store', store, *args, '--json').stdout)
    return list(report['runs'])


def gc(store: str, grace: str) -> dict[str, int]:
    return dict(json.loads(cli('gc', '--store', store, '--grace', grace, '--json').stdout))


async def remaining(spec: dict[str, Any]) -> list[str]:
    async with from_spec(**spec) as store:
        return [record.run_id for record in await store.list_runs()]


async def test_prune_and_gc_on_every_store(session: BackendSession) -> None:
    spec = spec_of(session)
    await write_runs(spec)
    store = store_url(spec)
    everything = ['old-completed', 'old-failed', 'old-crashed', 'old-running', 'new-completed']

    dry = prune(store, '--older-than', '30d', '--dry-run')
    assert dry == ['old-completed', 'old-failed', 'old-crashed']
    assert await remaining(spec) == everything, 'a dry run deletes nothing'

    assert prune(store, '--older-than', '30d', '--status', 'failed') == ['old-failed']
    assert gc(store, '1h')['blobs'] == 0, 'the picture was stored too recently'
    collected = gc(store, '0s')
    assert collected['blobs'] == 1, 'the picture nothing refers to any more'
    assert gc(store, '0s') == {'messages': 0, 'blobs': 0}

    human = cli('prune', '--store', store, '--older-than', '30d', '--status', 'crashed', '--status', 'completed')
    assert 'deleted 2 run(s)' in human.stdout and 'old-completed' in human.stdout and 'old-crashed' in human.stdout
    assert prune(store, '--older-than', '30d') == [], 'the running run stays'
    assert prune(store, '--older-than', '4w', '--include-running') == ['old-running']
    assert await remaining(spec) == ['new-completed']
    assert 'removed 0 unreferenced' in cli('gc', '--store', store).stdout


async def test_errors(session: BackendSession) -> None:
    spec = spec_of(session)
    async with from_spec(**spec) as opened:  # a store that exists (a missing one is refused: exit 4)
        await opened.register_run(RunRecord(run_id='kept', agent_name='worker'))
    store = store_url(spec)
    assert 'duration' in cli('prune', '--store', store, '--older-than', 'soon', expect=2).stderr
    assert 'unknown --status' in cli('prune', '--store', store, '--older-than', '1d', '--status', 'ok', expect=2).stderr
    assert (
        '--include-running'
        in cli('prune', '--store', store, '--older-than', '1d', '--status', 'running', expect=2).stderr
    )
    assert 'duration' in cli('gc', '--store', store, '--grace', '-1h', expect=2).stderr
    assert 'reuse window' in cli('gc', '--store', store, '--grace', '5m', '--json').stderr


@pytest.mark.parametrize(
    'url',
    [
        'postgresql://nobody:secret@127.0.0.1:1/none',
        'mongodb://nobody:secret@127.0.0.1:1/none?serverSelectionTimeoutMS=300',
    ],
)
@pytest.mark.parametrize('command', [['prune', '--older-than', '30d'], ['gc']])
def test_unreachable_and_bad_urls(url: str, command: list[str]) -> None:
    unreachable = cli(*command, '--store', url, '--json', expect=4)
    assert 'cannot reach' in unreachable.stderr and 'secret' not in unreachable.stderr and unreachable.stdout == ''
    bad = cli(*command, '--store', url.replace('postgresql', 'oracle').replace('mongodb', 'couch'), expect=2)
    assert 'supported' in bad.stderr and 'secret' not in bad.stderr
