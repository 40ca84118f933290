"""`step-persistence db ...` run as a console script against fresh SQLite and PostgreSQL databases."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from step_persistence import PostgresStepStore, RunRecord
from step_persistence.stores.sql import TABLE_NAMES, VERSION_TABLE
from step_persistence.stores.sql.migrate import head_revision
from step_persistence.stores.sql.reporting import read_report
from support.console_script import cli
from support.databases import EmptyDatabase

pytestmark = pytest.mark.anyio
VIEWS = {'run_summary', 'tool_call_stats'}
SINCE_0005 = {'history_lines', 'conversations'}
"""The tables revision 0005 added (history lines, conversation summaries)."""
SINCE_0008 = {'durable_units', 'durable_workflows'}
"""The tables revision 0008 added (the durable journal)."""
HEAD = head_revision()


def plain(url: str) -> str:
    """The URL as a user types it, without the async driver."""
    return url.replace('+aiosqlite', '').replace('+asyncpg', '')


def db(*args: str, expect: int = 0) -> Any:
    """Run `step-persistence db ARGS... --json` and return what it printed."""
    return json.loads(cli('db', *args, '--json', expect=expect).stdout)


def refuse_a_missing_file(store: str) -> None:
    """Only `db upgrade` creates a SQLite file: the other commands refuse one that does not exist (exit 4),
    which then holds an empty database."""
    path = Path(store.removeprefix('sqlite:///'))
    for command in ('current', 'downgrade base', 'stamp head'):
        refused = cli('db', *command.split(), '--store', store, expect=4)
        assert f'no SQLite database at {path}' in refused.stderr, command
    assert not path.exists()
    path.touch()


async def test_upgrade_current_downgrade_and_stamp_a_fresh_database(empty_database: EmptyDatabase) -> None:
    store = plain(empty_database.url)
    if empty_database.dialect == 'sqlite':
        refuse_a_missing_file(store)
    assert db('current', '--store', store) == {'revision': None, 'head': HEAD}

    upgraded = cli('db', 'upgrade', '--store', store).stdout
    assert f'at revision {HEAD} (head)' in upgraded
    assert await empty_database.table_names() == TABLE_NAMES | {VERSION_TABLE}
    assert await empty_database.view_names() == VIEWS

    assert db('downgrade', '0002', '--store', store)['revision'] == '0002'
    assert await empty_database.view_names() == set()
    assert SINCE_0005 | SINCE_0008 <= TABLE_NAMES
    assert await empty_database.table_names() == (TABLE_NAMES - SINCE_0005 - SINCE_0008) | {VERSION_TABLE}

    assert db('downgrade', 'base', '--store', store)['revision'] is None
    assert await empty_database.table_names() == {VERSION_TABLE}

    assert db('stamp', 'head', '--store', store)['revision'] == HEAD
    assert await empty_database.table_names() == {VERSION_TABLE}, 'stamp records a revision and runs nothing'


async def test_a_postgres_schema_holds_the_tables_and_views(postgres_database: EmptyDatabase) -> None:
    store = plain(postgres_database.url)
    assert db('upgrade', '--store', store, '--schema', 'steps')['revision'] == HEAD
    assert await postgres_database.table_names(schema='steps') == TABLE_NAMES | {VERSION_TABLE}
    assert await postgres_database.view_names(schema='steps') == VIEWS
    assert await postgres_database.table_names() == set()
    assert db('current', '--store', store) == {'revision': None, 'head': HEAD}

    async with PostgresStepStore(postgres_database.url, schema='steps', auto_migrate=False) as steps:
        await steps.register_run(RunRecord(run_id='in-schema', agent_name='librarian'))
        summaries, stats = await read_report(steps)
    assert [(s.run_id, s.status) for s in summaries] == [('in-schema', 'running')] and stats == []


def test_errors_have_exit_codes(tmp_path: Path) -> None:
    store = f'sqlite:///{tmp_path / "runs.db"}'

    not_sql = cli('db', 'upgrade', '--store', 'mongodb://app:s3cret@db.internal/runs', expect=2)
    assert 'SQL stores' in not_sql.stderr and 's3cret' not in not_sql.stderr
    assert '--schema' in cli('db', 'current', '--store', store, '--schema', 'steps', expect=2).stderr

    assert 'nope' in cli('db', 'upgrade', 'nope', '--store', store, expect=3).stderr
    assert 'downgrade target' in cli('db', 'downgrade', 'head', '--store', store, expect=2).stderr

    stamped = f'sqlite:///{tmp_path / "stamped.db"}'
    (tmp_path / 'stamped.db').touch()
    assert db('stamp', '0001', '--store', stamped)['revision'] == '0001'
    assert 'rolled back' in cli('db', 'upgrade', '--store', stamped, expect=1).stderr
    assert db('current', '--store', stamped)['revision'] == '0001'

    unreachable = cli('db', 'current', '--store', 'postgresql://nobody@127.0.0.1:1/none', expect=4)
    assert 'cannot reach' in unreachable.stderr


def test_help() -> None:
    shown = cli('db', '--help').stdout
    assert all(command in shown for command in ('upgrade', 'downgrade', 'current', 'stamp'))
