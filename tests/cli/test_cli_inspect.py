"""The `step-persistence` console script against every durable store, run in a subprocess."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from step_persistence import RunRecord, from_spec
from support.backends import BACKENDS, BackendSession, spec_of
from support.console_script import cli, python_script

pytestmark = pytest.mark.anyio
CHILD = Path(__file__).resolve().parents[1] / 'support' / 'child.py'


def store_url(spec: dict[str, Any]) -> str:
    """The `--store` URL naming the same data as a backend's `from_spec` arguments."""
    backend = spec['backend']
    if backend == 'file':
        return f'file://{spec["directory"]}'
    if backend == 'sqlite':
        return f'sqlite:///{spec["database"]}'
    if backend == 'mongo':
        return urlsplit(spec['db_url'])._replace(path=f'/{spec["database"]}').geturl()
    return str(backend)


@pytest.fixture(params=['file', 'sqlite', 'postgres', 'mongo'])
async def cli_session(request: pytest.FixtureRequest) -> AsyncIterator[BackendSession]:
    """A durable store per backend kind the command line opens by URL (motor shares mongo's URL)."""
    async with BACKENDS[request.param].open(request) as session:
        yield session


def populate(spec: dict[str, Any]) -> None:
    """An orchestrator with a delegate, then a worker that crashes mid-tool."""
    for scenario, code in (('delegate', 0), ('crash', 17)):
        completed = python_script(CHILD, scenario, json.dumps(spec))
        assert completed.returncode == code, completed.stderr


async def test_inspection_commands_on_every_store(cli_session: BackendSession) -> None:
    spec = spec_of(cli_session)
    populate(spec)
    store = store_url(spec)

    runs = json.loads(cli('runs', 'list', '--store', store, '--json').stdout)
    by_agent = {run['agent_name']: run for run in runs}
    assert set(by_agent) == {'orchestrator', 'librarian', 'worker'}
    assert by_agent['orchestrator']['status'] == 'completed'
    assert by_agent['worker']['status'] == 'crashed'
    assert by_agent['worker']['unresolved_effects'] == 1
    assert by_agent['librarian']['parent_run_id'] == by_agent['orchestrator']['run_id']

    crashed = json.loads(cli('runs', 'list', '--store', store, '--status', 'crashed', '--json').stdout)
    assert [run['agent_name'] for run in crashed] == ['worker']
    assert (
        json.loads(cli('runs', 'list', '--store', store, '--agent', 'librarian', '--json').stdout)[0]['run_id']
        == (by_agent['librarian']['run_id'])
    )
    assert (
        json.loads(cli('runs', 'list', '--store', store, '--since', '2999-01-01T00:00:00+00:00', '--json').stdout) == []
    )
    conversation = json.loads(cli('runs', 'list', '--store', store, '--conversation', 'orch-conv', '--json').stdout)
    assert [run['agent_name'] for run in conversation] == ['orchestrator']

    worker = by_agent['worker']['run_id']
    shown = json.loads(cli('runs', 'show', worker, '--store', store, '--json').stdout)
    assert shown['run']['run_id'] == worker
    assert [effect['status'] for effect in shown['tool_effects']] == ['completed', 'started']
    assert shown['events'][-1]['kind'] == 'tool_call_started'
    assert [snapshot['messages'] for snapshot in shown['snapshots']] == [3]

    tree = json.loads(cli('runs', 'tree', by_agent['orchestrator']['run_id'], '--store', store, '--json').stdout)
    assert tree['status'] == 'completed'
    assert [child['record']['agent_name'] for child in tree['children']] == ['librarian']

    unresolved = json.loads(cli('runs', 'unresolved', '--store', store, '--json').stdout)
    assert [(entry['run']['run_id'], [e['tool_name'] for e in entry['unresolved']]) for entry in unresolved] == [
        (worker, ['charge_card'])
    ]

    report = json.loads(cli('report', '--store', store, '--json').stdout)
    assert {row['run_id'] for row in report['runs']} == {run['run_id'] for run in runs}
    tools = {row['tool_name']: row for row in report['tools']}
    assert tools['charge_card']['unresolved'] == 1
    assert tools['search']['calls'] == 1

    human = cli('runs', 'tree', by_agent['orchestrator']['run_id'], '--store', store).stdout
    assert 'librarian' in human and 'completed' in human


async def test_errors_are_clear_and_have_exit_codes(cli_session: BackendSession) -> None:
    spec = spec_of(cli_session)
    async with from_spec(**spec) as opened:  # a store that exists (reading a missing one is refused: exit 4)
        await opened.register_run(RunRecord(run_id='some-run'))
    store = store_url(spec)
    missing = cli('runs', 'show', 'no-such-run', '--store', store, expect=3)
    assert 'no-such-run' in missing.stderr and missing.stdout == ''
    cli('runs', 'tree', 'no-such-run', '--store', store, expect=3)


def test_bad_store_url_is_a_usage_error() -> None:
    bad = cli('runs', 'list', '--store', 'oracle://scott:tiger@db/x', expect=2)
    assert 'oracle' in bad.stderr and 'supported' in bad.stderr
    assert 'tiger' not in bad.stderr
    timeout = cli('runs', 'list', '--store', 'postgresql://scott:tiger@db/x?timeout=soon', expect=2)
    assert 'timeout must be a positive number of seconds' in timeout.stderr and 'tiger' not in timeout.stderr


def test_unreachable_server_is_reported() -> None:
    unreachable = cli('runs', 'list', '--store', 'postgresql://nobody@127.0.0.1:1/none', expect=4)
    assert 'cannot reach' in unreachable.stderr


def test_help_everywhere() -> None:
    for command in (
        [],
        ['runs'],
        ['runs', 'list'],
        ['runs', 'show'],
        ['report'],
        ['demo'],
        ['copy'],
        ['prune'],
        ['gc'],
        ['recover', '--dry-run'],
    ):
        assert 'Usage' in cli(*command, '--help').stdout
