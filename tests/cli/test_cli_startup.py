"""A command imports only what it uses (issue 18, item 5), checked in a new interpreter per command.

The time itself is measured by benchmarks/cli_startup.py (benchmarks/RESULTS.md); here, what each
command loads: help loads neither pydantic-ai nor SQLAlchemy nor Alembic, and a store of one kind
does not load another kind's driver.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import get_args

import pytest

from step_persistence.cli._common import RUN_STATUS_NAMES, RunStatusName
from step_persistence.records import RUN_STATUSES, RunStatus

HEAVY = ('pydantic_ai', 'sqlalchemy', 'alembic', 'asyncpg', 'pymongo', 'motor', 'aiosqlite', 'step_persistence.stores')

LOADED = """
import json, sys
heavy = json.loads(sys.argv[2])
sys.argv = ['step-persistence', *json.loads(sys.argv[1])]
from step_persistence.cli import main
try:
    main()
except SystemExit:
    pass
loaded = {name for name in heavy for module in sys.modules if (module + '.').startswith(name + '.')}
print(json.dumps(sorted(loaded)))
"""


def loaded(*args: str) -> set[str]:
    """Which of `HEAVY` the console script's entry point had imported once `step-persistence ARGS...` ended."""
    completed = subprocess.run(
        [sys.executable, '-c', LOADED, json.dumps(args), json.dumps(HEAVY)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return set(json.loads(completed.stdout.strip().splitlines()[-1]))


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
    assert found & {'sqlalchemy', 'alembic', 'asyncpg', 'pymongo', 'motor', 'aiosqlite'} == set(), found


def test_the_status_names_are_the_records_ones() -> None:
    assert set(get_args(RunStatusName)) == set(RUN_STATUS_NAMES) == set(get_args(RunStatus)) == RUN_STATUSES
