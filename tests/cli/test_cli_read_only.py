"""Reading never writes (issue 18, item 1): commands that read a store refuse one that does not exist and
create nothing; on tables at an older revision they say to run `step-persistence db upgrade`. Only
`db upgrade` and the destination of `copy` create or migrate a store."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from step_persistence import RunRecord, SqlStepStore, from_spec
from step_persistence.stores.sql.migrate import downgrade, head_revision
from support.console_script import cli
from support.databases import EmptyDatabase

pytestmark = pytest.mark.anyio

STORE_ENV = 'STEP_PERSISTENCE_STORE'
EXIT_UNREACHABLE = 4
EXIT_DATABASE = 5

ON_ONE_STORE = [
    ['runs', 'list'],
    ['runs', 'show', 'r'],
    ['runs', 'tree', 'r'],
    ['runs', 'unresolved'],
    ['runs', 'messages', 'r'],
    ['conversations', 'list'],
    ['conversations', 'show', 'c'],
    ['report'],
    ['runs', 'delete', 'r'],
    ['runs', 'resolve', 'r', 'call', '--status', 'completed', '--summary', 'checked'],
    ['prune', '--older-than', '1d'],
    ['gc'],
]
"""Every command on one existing store's data: the reads, and the writes that change what is stored."""

DB_READS = [['db', 'current'], ['db', 'downgrade', 'base'], ['db', 'stamp', 'head']]
"""The `db` commands that never create a SQLite file (only `db upgrade` does)."""


def plain(url: str) -> str:
    """The URL as a user types it, without the async driver."""
    return url.replace('+aiosqlite', '').replace('+asyncpg', '')


def every_file(root: Path) -> list[str]:
    return sorted(str(path.relative_to(root)) for path in root.rglob('*'))


def commands_on(store: str, *, with_db: bool) -> list[list[str]]:
    """Every command above on `store`, and `copy` from it to a store that does not exist either."""
    on_store = [*ON_ONE_STORE, *(DB_READS if with_db else [])]
    return [
        *([*command, '--store', store] for command in on_store),
        ['copy', store, 'memory://'],
        ['copy', store, 'sqlite:///copied.db'],
    ]


@pytest.fixture
def in_empty_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A working directory with nothing in it, and no store in the environment."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(STORE_ENV, raising=False)
    return tmp_path


def test_a_sqlite_file_that_does_not_exist_is_refused_and_not_created(in_empty_directory: Path) -> None:
    for command in commands_on('sqlite:///sub/nothere.db', with_db=True):
        refused = cli(*command, expect=EXIT_UNREACHABLE)
        assert f'no SQLite database at sub/nothere.db (in {in_empty_directory})' in refused.stderr, command
        assert refused.stdout == '', command
    absolute = in_empty_directory / 'abs' / 'nothere.db'
    refused = cli('runs', 'list', '--store', f'sqlite:///{absolute}', expect=EXIT_UNREACHABLE)
    assert f'no SQLite database at {absolute}: the file does not exist' in refused.stderr
    assert 'step-persistence db upgrade --store' in refused.stderr
    default = cli('report', expect=EXIT_UNREACHABLE)  # the default store, sqlite:///runs.db
    assert 'no SQLite database at runs.db' in default.stderr and '0 run(s)' not in default.stdout
    assert every_file(in_empty_directory) == [], 'no file, no directory, no copy destination'


def test_a_file_store_directory_that_does_not_exist_is_refused_and_not_created(in_empty_directory: Path) -> None:
    for command in commands_on('file://sub/nodir', with_db=False):
        refused = cli(*command, expect=EXIT_UNREACHABLE)
        assert f'no file store at sub/nodir (in {in_empty_directory})' in refused.stderr, command
        assert refused.stdout == '', command
    assert every_file(in_empty_directory) == []


def touch(path: Path) -> None:
    path.touch()


async def test_a_database_without_tables_is_refused_and_left_empty(
    empty_database: EmptyDatabase, in_empty_directory: Path
) -> None:
    store = plain(empty_database.url)
    if empty_database.dialect == 'sqlite':
        touch(Path(store.removeprefix('sqlite:///')))  # an empty database file (an application's, say)
    before = every_file(in_empty_directory)
    for command in commands_on(store, with_db=False):
        refused = cli(*command, expect=EXIT_UNREACHABLE)
        assert 'holds no step-persistence tables' in refused.stderr, command
        assert f'step-persistence db upgrade --store {store}' in refused.stderr, command
    assert await empty_database.table_names() == set()
    assert every_file(in_empty_directory) == before, 'no copy destination either'
    if empty_database.dialect == 'postgresql':
        in_schema = f'{store}?schema=steps'
        assert 'holds no step-persistence tables' in cli('runs', 'list', '--store', in_schema, expect=4).stderr
        assert await empty_database.table_names(schema='steps') == set()


async def store_downgraded_to_0004(url: str) -> None:
    async with SqlStepStore(url) as store:
        await store.register_run(RunRecord(run_id='r', agent_name='librarian', conversation_id='c'))
        await downgrade(await store.ready_database(), '0004')


def revision_of(store: str) -> str | None:
    revision: str | None = json.loads(cli('db', 'current', '--store', store, '--json').stdout)['revision']
    return revision


async def test_an_older_revision_is_not_migrated_by_reading(
    empty_database: EmptyDatabase, in_empty_directory: Path
) -> None:
    await store_downgraded_to_0004(empty_database.url)
    store = plain(empty_database.url)
    for command in commands_on(store, with_db=False):
        refused = cli(*command, expect=EXIT_DATABASE)
        assert 'is at schema revision 0004, older than' in refused.stderr, command
        assert f'run `step-persistence db upgrade --store {store}`' in refused.stderr, command
        assert 'no such table' not in refused.stderr and 'does not exist' not in refused.stderr, command
    assert revision_of(store) == '0004', 'no command migrated it'
    assert 'copied.db' not in every_file(in_empty_directory)

    cli('db', 'upgrade', '--store', store)
    assert [run['run_id'] for run in json.loads(cli('runs', 'list', '--store', store, '--json').stdout)] == ['r']


def test_db_upgrade_creates_a_missing_file_and_its_directories(in_empty_directory: Path) -> None:
    upgraded = json.loads(cli('db', 'upgrade', '--store', 'sqlite:///new/dir/runs.db', '--json').stdout)
    assert upgraded == {'revision': head_revision(), 'head': head_revision()}
    assert (in_empty_directory / 'new' / 'dir' / 'runs.db').is_file()
    assert json.loads(cli('runs', 'list', '--store', 'sqlite:///new/dir/runs.db', '--json').stdout) == []


async def test_copy_creates_and_upgrades_its_destination(
    empty_database: EmptyDatabase, in_empty_directory: Path
) -> None:
    source = f'file://{in_empty_directory / "source"}'
    async with from_spec(source) as store:
        await store.register_run(RunRecord(run_id='copied', agent_name='librarian'))

    created = 'sqlite:///new/dir/copy.db'
    assert '1 run(s) copied' in cli('copy', source, created).stdout
    assert [run['run_id'] for run in json.loads(cli('runs', 'list', '--store', created, '--json').stdout)] == ['copied']

    await store_downgraded_to_0004(empty_database.url)
    older = plain(empty_database.url)
    assert '1 run(s) copied' in cli('copy', source, older).stdout, 'a write the user asked for upgrades'
    assert revision_of(older) == head_revision()
    listed = json.loads(cli('runs', 'list', '--store', older, '--json').stdout)
    assert sorted(run['run_id'] for run in listed) == ['copied', 'r']
