"""A command imports only what it uses (issue 18, item 5), checked in a new interpreter per command.

The time itself is measured by benchmarks/cli_startup.py (benchmarks/RESULTS.md); here, what each
command loads: help loads neither pydantic-ai nor SQLAlchemy nor Alembic; a command that reads no
message (listing, reporting, trees, unresolved calls) loads no pydantic-ai, a read loads no Alembic,
a read on SQLite neither SQLAlchemy's ORM, nor its asyncio extension, nor its PostgreSQL dialect, nor
anyio's backend, a table of runs, tools or conversations written to a pipe no rich, and a store of
one kind does not load another kind's driver. The stores read hold a run with a snapshot, so a
command that decoded a message would load pydantic-ai. And typer builds only the commands a command
line names.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any, NamedTuple, get_args

import pytest
import typer
import typer.main
from pydantic_ai.messages import ModelRequest, UserPromptPart

from step_persistence import ContinuableSnapshot, RunRecord, StepEvent, ToolEffectRecord, from_spec
from step_persistence.cli import app as cli_app
from step_persistence.cli._common import RUN_STATUS_NAMES, RunStatusName
from step_persistence.cli.runs import app as runs_app
from step_persistence.records import RUN_STATUSES, RunStatus

HEAVY = ('pydantic_ai', 'sqlalchemy', 'alembic', 'asyncpg', 'pymongo', 'motor', 'aiosqlite', 'step_persistence.stores')
SQL_AND_OTHER_DRIVERS = {'sqlalchemy', 'alembic', 'asyncpg', 'pymongo', 'motor', 'aiosqlite'}
NOT_FOR_A_SQLITE_READ = (
    'pydantic_ai',
    'alembic',
    'asyncpg',
    'pymongo',
    'motor',
    'sqlalchemy.orm',
    'sqlalchemy.ext.asyncio',
    'sqlalchemy.dialects.postgresql',
    'anyio._backends',
)
"""What a SQLite read of no message never loads: the store runs Core statements on a `sqlite3` engine, on
threads of its own (no anyio event-loop backend), and nothing of the schema or the statements needs
SQLAlchemy's PostgreSQL dialect there."""
RUN = 'agent.-run-1'

LOADED = """
import gc, json, sys
heavy = json.loads(sys.argv[2])
sys.argv = ['step-persistence', *json.loads(sys.argv[1])]
from step_persistence.cli import main
code = 0
try:
    main()
except SystemExit as exit:
    code = exit.code or 0
loaded = {name for name in heavy for module in sys.modules if (module + '.').startswith(name + '.')}
frozen = gc.get_freeze_count() if gc.isenabled() else None
print(json.dumps({'loaded': sorted(loaded), 'code': code, 'frozen': frozen}))
"""


class Started(NamedTuple):
    loaded: set[str]
    """Which of the modules and packages watched were imported."""
    printed: str
    frozen: int | None
    """How many objects the garbage collector ignores (`gc.freeze`) at the end; `None`: it was not collecting."""


def started(*args: str, watched: tuple[str, ...] = HEAVY) -> Started:
    """What `step-persistence ARGS...` had done once it ended, in a new interpreter with its output a pipe:
    which of `watched` the console script's entry point had imported, what the command printed, and how the
    garbage collector was left; the command must succeed."""
    completed = subprocess.run(
        [sys.executable, '-c', LOADED, json.dumps(args), json.dumps(watched)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    *printed, last = completed.stdout.strip().splitlines()
    result = json.loads(last)
    assert result['code'] == 0, (args, completed.stdout, completed.stderr)
    return Started(set(result['loaded']), '\n'.join(printed), result['frozen'])


def loaded(*args: str) -> set[str]:
    """Which of `HEAVY` `step-persistence ARGS...` imported (it must succeed)."""
    return started(*args).loaded


async def store_with_a_run(url: str) -> str:
    """`url`'s store holding one run that has an event, an unresolved tool call and a snapshot; returns `url`."""
    async with from_spec(url) as store:
        await store.register_run(RunRecord(run_id=RUN, agent_name='agent', conversation_id='chat'))
        await store.append_event(StepEvent(run_id=RUN, kind='run_started', step_index=0))
        await store.record_tool_effect(
            ToolEffectRecord(run_id=RUN, tool_call_id='call-1', tool_name='search', status='started')
        )
        messages = [ModelRequest(parts=[UserPromptPart('question')])]
        await store.save_snapshot(ContinuableSnapshot(run_id=RUN, step_index=1, messages=messages))
    return url


NO_MESSAGE_READ = [
    ['runs', 'list'],
    ['report'],
    ['conversations', 'list'],
    ['runs', 'tree', RUN],
    ['runs', 'unresolved'],
]
"""Commands that read runs, events and tool effects but no message."""

PLAIN_TABLES = (['runs', 'list'], ['report'], ['conversations', 'list'])
"""Commands printing tables of many rows (`cli/tables.py`), plain text in a pipe."""


@pytest.mark.parametrize(
    'args',
    [
        ['--help'],
        ['runs', '--help'],
        ['runs', 'list', '--help'],
        ['db', 'upgrade', '--help'],
        ['report', '--help'],
        ['conversations', '--help'],
        ['conversations', 'show', '--help'],
    ],
)
def test_help_imports_nothing_heavy(args: list[str]) -> None:
    assert loaded(*args) == set()


@pytest.mark.parametrize('words', [['runs', 'list'], ['conversations', 'list']])
def test_a_file_store_command_imports_no_sql_and_no_other_driver(words: list[str], tmp_path: Path) -> None:
    found = loaded(*words, '--store', f'file://{tmp_path}')
    assert found & SQL_AND_OTHER_DRIVERS == set(), found


@pytest.mark.anyio
@pytest.mark.parametrize('words', NO_MESSAGE_READ, ids=' '.join)
async def test_a_sqlite_read_of_no_message_imports_no_pydantic_ai_no_alembic_and_no_orm(
    words: list[str], tmp_path: Path
) -> None:
    url = await store_with_a_run(f'sqlite:///{tmp_path / "runs.db"}')
    plain = words in PLAIN_TABLES
    found, printed, frozen = started(*words, '--store', url, watched=(*NOT_FOR_A_SQLITE_READ, 'rich'))
    assert RUN in printed
    assert found & set(NOT_FOR_A_SQLITE_READ) == set(), found
    assert ('rich' in found) != plain, (found, 'tables in a pipe are plain text; trees go through rich')
    assert frozen, 'collecting again once the store is open, what start-up made left out'


@pytest.mark.anyio
@pytest.mark.parametrize('words', [['runs', 'list'], ['report'], ['runs', 'unresolved']], ids=' '.join)
async def test_a_file_store_read_imports_no_sql_no_other_driver_and_no_pydantic_ai(
    words: list[str], tmp_path: Path
) -> None:
    url = await store_with_a_run(f'file://{tmp_path / "runs"}')
    found, printed, _ = started(*words, '--store', url)
    assert RUN in printed
    assert found & {*SQL_AND_OTHER_DRIVERS, 'pydantic_ai'} == set(), (
        found,
        'snapshot states are read without messages',
    )


@pytest.mark.parametrize('words', [['runs', 'list'], ['report']], ids=' '.join)
def test_a_memory_store_command_imports_no_store_library(words: list[str]) -> None:
    assert loaded(*words, '--store', 'memory://') & {'pydantic_ai', *SQL_AND_OTHER_DRIVERS} == set()


@pytest.mark.anyio
async def test_a_command_that_shows_messages_still_decodes_them(tmp_path: Path) -> None:
    url = await store_with_a_run(f'sqlite:///{tmp_path / "runs.db"}')
    found, printed, _ = started('runs', 'messages', RUN, '--store', url)
    assert 'question' in printed
    assert 'pydantic_ai' in found


def test_the_status_names_are_the_records_ones() -> None:
    assert set(get_args(RunStatusName)) == set(RUN_STATUS_NAMES) == set(get_args(RunStatus)) == RUN_STATUSES


def test_typer_builds_only_the_commands_a_command_line_names(monkeypatch: pytest.MonkeyPatch) -> None:
    built: list[str] = []
    build = typer.main.get_command

    def building(app: typer.Typer) -> Any:
        """`typer.main.get_command`, noting the function of a command built alone (`cli/lazy.py`)."""
        if len(app.registered_commands) == 1 and not app.registered_groups:
            callback = app.registered_commands[0].callback
            assert callback is not None
            built.append(callback.__name__)
        return build(app)

    def built_by(*args: str) -> list[str]:
        built.clear()
        with pytest.raises(SystemExit) as exit:
            cli_app(list(args), prog_name='step-persistence')
        assert exit.value.code == 0
        return list(built)

    monkeypatch.setattr(typer.main, 'get_command', building)
    assert built_by('runs', 'list', '--store', 'memory://') == ['list_runs']
    every = [info.callback.__name__ for info in runs_app.registered_commands if info.callback is not None]
    assert len(every) > 1
    assert built_by('runs', '--help') == every, 'help lists every command, so builds each'
