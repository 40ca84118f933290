"""Every command takes its store the same way: `--store URL`, or `STEP_PERSISTENCE_STORE`; `postgres://` and
`?schema=` work everywhere, on the session's real PostgreSQL server (issue 18, items 2 and 3)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from step_persistence import PostgresStepStore, RunRecord, from_spec
from step_persistence.cli import app
from step_persistence.spec import sql_location
from support.console_script import cli
from support.databases import EmptyDatabase

pytestmark = pytest.mark.anyio

STORE_ENV = 'STEP_PERSISTENCE_STORE'
TAKES_STORES_AS_ARGUMENTS = {('copy',)}
"""`copy SRC DST` names two stores; every other command takes one, as --store."""


def commands() -> dict[tuple[str, ...], Any]:
    """Every command of the console script, by its words (`('runs', 'list')`)."""
    import typer.main

    found: dict[tuple[str, ...], Any] = {}

    def walk(command: Any, words: tuple[str, ...]) -> None:
        subcommands = getattr(command, 'commands', None)
        if subcommands is None:
            found[words] = command
            return
        for name, sub in subcommands.items():
            walk(sub, (*words, name))

    walk(typer.main.get_command(app), ())
    return found


def test_every_command_takes_store_url_or_the_environment() -> None:
    every = commands()
    assert {('runs', 'list'), ('runs', 'delete'), ('db', 'current'), ('demo',), ('report',)} <= set(every)
    for words, command in every.items():
        if words in TAKES_STORES_AS_ARGUMENTS:
            continue
        options = {param.name: param for param in command.params}
        store = options.get('store')
        assert store is not None, f'{" ".join(words)} has no --store'
        assert '--store' in store.opts and store.envvar == STORE_ENV, (words, store.opts, store.envvar)


def test_the_environment_names_the_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(STORE_ENV, f'file://{tmp_path}')
    assert json.loads(cli('runs', 'list', '--json').stdout) == []
    monkeypatch.setenv(STORE_ENV, 'oracle://scott:tiger@db/x')
    for command in (['runs', 'list'], ['report'], ['runs', 'unresolved'], ['gc'], ['prune', '--older-than', '1d']):
        refused = cli(*command, expect=2)
        assert 'oracle' in refused.stderr and 'tiger' not in refused.stderr, command
    assert 'SQL stores' in cli('db', 'current', expect=2).stderr
    monkeypatch.setenv(STORE_ENV, 'oracle://elsewhere/x')
    assert json.loads(cli('runs', 'list', '--store', f'file://{tmp_path}', '--json').stdout) == [], '--store wins'


def test_sql_location_maps_the_scheme_and_takes_the_schema_and_table_prefix() -> None:
    url, named = sql_location('postgres://app:p%40ss@db.internal:5433/steps?schema=agents&timeout=5&table_prefix=sp_')
    assert (url.drivername, url.password, url.database, dict(url.query), named) == (
        'postgresql',
        'p@ss',
        'steps',
        {'timeout': '5'},
        {'schema': 'agents', 'table_prefix': 'sp_'},
    )
    assert sql_location('postgres+asyncpg://db/x')[0].drivername == 'postgresql+asyncpg'
    assert sql_location('postgresql://db/x')[1] == {}
    assert sql_location('sqlite:///runs.db?table_prefix=sp_') == (
        sql_location('sqlite:///runs.db')[0],
        {'table_prefix': 'sp_'},
    )
    with pytest.raises(ValueError, match='once'):
        sql_location('sqlite:///runs.db?table_prefix=a&table_prefix=b')
    with pytest.raises(ValueError, match='PostgreSQL stores only'):
        from_spec('sqlite:///runs.db?schema=steps')
    with pytest.raises(ValueError, match='two values of table_prefix'):
        from_spec('sqlite:///runs.db?table_prefix=a_', table_prefix='b_')
    with pytest.raises(ValueError, match='two values of schema'):
        from_spec('postgresql://db/x?schema=a', schema='b')


async def test_postgres_scheme_and_schema_on_the_real_server(postgres_database: EmptyDatabase) -> None:
    hosted = postgres_database.url.replace('postgresql+asyncpg://', 'postgres://')
    in_schema = f'{hosted}?schema=steps'

    async with from_spec(in_schema) as store:
        assert isinstance(store, PostgresStepStore)
        await store.register_run(RunRecord(run_id='kept-in-a-schema', agent_name='librarian'))
    assert await postgres_database.table_names(schema='steps') >= {'runs', 'events'}
    assert 'runs' not in await postgres_database.table_names(), 'nothing outside the schema'
    async with PostgresStepStore(postgres_database.url, schema='steps', auto_migrate=False) as direct:
        assert (await direct.get_run(run_id='kept-in-a-schema')) is not None

    listed = json.loads(cli('runs', 'list', '--store', in_schema, '--json').stdout)
    assert [run['run_id'] for run in listed] == ['kept-in-a-schema']
    shown = json.loads(cli('runs', 'show', 'kept', '--store', in_schema, '--json').stdout)
    assert shown['run']['agent_name'] == 'librarian'
    assert json.loads(cli('report', '--store', in_schema, '--json').stdout)['runs'][0]['run_id'] == 'kept-in-a-schema'

    current = json.loads(cli('db', 'current', '--store', in_schema, '--json').stdout)
    assert current['revision'] == current['head'] is not None
    assert json.loads(cli('db', 'current', '--store', hosted, '--json').stdout)['revision'] is None
    same = json.loads(cli('db', 'current', '--store', in_schema, '--schema', 'steps', '--json').stdout)
    assert same == current
    assert 'two schemas' in cli('db', 'current', '--store', in_schema, '--schema', 'other', expect=2).stderr
