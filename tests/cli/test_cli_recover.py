"""`step-persistence recover`: lists (--dry-run, reading only) and resumes the workflows whose lease expired.

The abandoned workflow is made in this process: its run is inside `charge` when another owner takes its
lease (as a process whose clock is past the expiry would), so the run stops at its next unit and leaves
the workflow `running` under a lease that has expired.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path

import pytest

from cli.test_cli_inspect import store_url
from step_persistence import StepStore, from_spec
from step_persistence.durable import LeaseLostError, WorkflowRecord, journal_for
from step_persistence.records import utc_now
from support.backends import BACKENDS, BackendSession, spec_of
from support.console_script import cli
from support.durable_agents import Calls, Counted, Shop, abandon_inside_charge, build_agent, build_shop_agent

pytestmark = pytest.mark.anyio

WORKFLOW = 'order-1'
HOSTILE = 'wf-[bold]1\x07'
"""A workflow journaled without a run (so with any id), by an agent named with markup and a control character."""

AGENTS_MODULE = """
import sys
from pathlib import Path

sys.path.insert(0, {tests!r})

from support.durable_agents import Calls, Counted, Shop, abandon_inside_charge, build_agent, build_shop_agent


def build(store):
    calls = Calls()

    def note(label):
        def append():
            with open({calls_file!r}, 'a') as calls_log:
                calls_log.write(label + '\\n')

        return append

    calls.hooks.update({{'charge': note('charge'), 'reserve': note('reserve')}})
    calls.hooks.update({{f'model:{{n}}': note('model') for n in range(1, 5)}})
    return [build_agent(store, calls, idempotent_b=True)]
"""


@pytest.fixture(params=['file', 'sqlite'])
async def session(request: pytest.FixtureRequest) -> AsyncIterator[BackendSession]:
    async with BACKENDS[request.param].open(request) as opened:
        yield opened


async def _abandon(store: StepStore) -> None:
    calls = Calls()
    inside, release = asyncio.Event(), asyncio.Event()

    async def hold() -> None:
        inside.set()
        await release.wait()

    calls.hooks['charge'] = hold
    run = asyncio.create_task(build_agent(store, calls, idempotent_b=True).run('two items', run_id=WORKFLOW))
    entered = asyncio.create_task(inside.wait())
    await asyncio.wait([run, entered], return_when=asyncio.FIRST_COMPLETED)
    if run.done():
        entered.cancel()
        run.result()  # raises what stopped the run before `charge`
        raise AssertionError('the run ended before charge')
    past = utc_now() - timedelta(seconds=1)
    await journal_for(store).claim_workflow(
        workflow_id=WORKFLOW, owner='a dead process', lease_expires_at=past, now=utc_now() + timedelta(hours=1)
    )
    release.set()
    with pytest.raises(LeaseLostError):
        await run


async def test_recover_lists_then_resumes_an_abandoned_workflow(
    session: BackendSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = spec_of(session)
    async with from_spec(**spec) as store:
        await _abandon(store)
        await journal_for(store).start_workflow(
            WorkflowRecord(
                workflow_id=HOSTILE, agent_name='[red]billing\x1b', updated_at=utc_now() + timedelta(hours=1)
            )
        )
    url = store_url(spec)
    calls_file = tmp_path / 'calls.txt'
    tests = str(Path(__file__).parents[1])
    (tmp_path / 'recovery_agents.py').write_text(AGENTS_MODULE.format(tests=tests, calls_file=str(calls_file)))
    monkeypatch.chdir(tmp_path)

    listed = json.loads(cli('recover', '--store', url, '--dry-run', '--json').stdout)
    assert [(each['workflow_id'], each['owner']) for each in listed['workflows']] == [
        (WORKFLOW, 'a dead process'),
        (HOSTILE, None),
    ]
    shown = cli('recover', '--store', url, '--dry-run').stdout
    assert 'order-1 (agent orders, 1 run(s))' in shown
    assert 'wf-[bold]1\\x07 (agent [red]billing\\x1b, 1 run(s))' in shown
    assert not calls_file.exists()  # the dry run ran nothing
    async with from_spec(**spec) as store:
        still = await journal_for(store).get_workflow(workflow_id=WORKFLOW)
        assert still is not None and (still.owner, still.status) == ('a dead process', 'running')  # nor claimed

    recovering = cli('recover', '--store', url, '--agents', 'recovery_agents:build', '--json')
    assert "workflow 'wf-[bold]1\\x07' skipped: no agent named '[red]billing\\x1b'" in recovering.stderr
    resumed = json.loads(recovering.stdout)
    assert resumed['workflows'][1]['outcome'] == 'skipped'
    assert resumed['workflows'][:1] == [
        {
            'workflow_id': WORKFLOW,
            'agent_name': 'orders',
            'outcome': 'resumed',
            'detail': None,
            'output': 'done: reserve=reserved A-1, charge=charged 1250',
        }
    ]
    # The charge that was in flight ran again and the last request ran; the first request and reserve replayed.
    assert sorted(calls_file.read_text().split()) == ['charge', 'model']
    again = cli('recover', '--store', url, '--agents', 'recovery_agents:build').stdout
    assert again.startswith('1 abandoned workflow(s)')  # the one no agent given runs
    assert 'wf-[bold]1\\x07 skipped' in again


def test_recover_needs_its_agents_and_says_what_is_wrong_with_them(tmp_path: Path) -> None:
    url = f'sqlite:///{tmp_path / "runs.db"}'
    assert 'give the agents' in cli('recover', '--store', url, expect=2).stderr
    refused = cli('recover', '--store', url, '--agents', 'no_such_module_here:agents', expect=2).stderr
    assert "cannot import 'no_such_module_here'" in refused
    assert 'MODULE:ATTRIBUTE' in cli('recover', '--store', url, '--agents', 'nocolon', expect=2).stderr


SHOP_MODULE = """
import sys

sys.path.insert(0, {tests!r})

from support.durable_agents import Counted, Shop, build_shop_agent


def build(store):
    return [build_shop_agent(store, Counted())]


async def deps(workflow):
    return Shop(workflow.workflow_id.split('-')[0])
"""


async def test_recover_gives_each_run_the_deps_made_for_its_workflow(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--deps` names a function of the workflow's record (here async); without it the agent's tool has none."""
    url = f'sqlite:///{tmp_path / "runs.db"}'
    async with from_spec(url) as store:
        counted = Counted()
        run = build_shop_agent(store, counted).run('Charge order 5', deps=Shop('north'), run_id='north-5')
        await abandon_inside_charge(store, run, counted, 'north-5')
    tests = str(Path(__file__).parents[1])
    (tmp_path / 'shop_agents.py').write_text(SHOP_MODULE.format(tests=tests))
    monkeypatch.chdir(tmp_path)
    refused = cli(
        'recover', '--store', url, '--agents', 'shop_agents:build', '--deps', 'shop_agents:Shop.name', expect=2
    )
    assert "--deps 'shop_agents:Shop.name'" in refused.stderr
    recovered = json.loads(
        cli('recover', '--store', url, '--agents', 'shop_agents:build', '--deps', 'shop_agents:deps', '--json').stdout
    )
    [workflow] = recovered['workflows']
    assert (workflow['outcome'], workflow['output']) == ('resumed', 'north charged 1250 after 0 earlier messages')
