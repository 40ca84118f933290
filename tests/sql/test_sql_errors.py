"""Bad input to the SQL store: unsupported databases, missing drivers, secrets in messages, bad options."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.ext.asyncio import create_async_engine

from step_persistence import PostgresStepStore, SqliteStepStore, SqlStepStore, from_spec

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize(
    ('url', 'builders'),
    [
        ('mysql+aiomysql://app:hunter2@db.example/runs', (SqlStepStore, from_spec)),
        ('mssql://app:hunter2@db.example/runs', (SqlStepStore, from_spec)),
        # from_spec (and so the command line) maps postgres:// to postgresql:// (tests/cli/test_cli_store_urls.py)
        ('postgres://app:hunter2@db.example/runs', (SqlStepStore,)),
    ],
)
def test_an_unsupported_dialect_names_the_supported_ones_without_the_password(
    url: str, builders: tuple[Any, ...]
) -> None:
    for build in builders:
        with pytest.raises(ValueError, match=r'postgresql.*sqlite') as raised:
            build(url)
        assert 'hunter2' not in str(raised.value)


def test_a_blocking_driver_is_refused_in_favour_of_the_async_one() -> None:
    with pytest.raises(ValueError, match='asyncpg') as raised:
        SqlStepStore('postgresql+psycopg2://app:hunter2@db.example/runs')
    assert 'hunter2' not in str(raised.value)
    with pytest.raises(ValueError, match='aiosqlite'):
        SqlStepStore('sqlite+pysqlite:///runs.db')


@pytest.mark.parametrize(
    ('query', 'message'),
    [
        ('timeout=soon', 'timeout must be a positive number of seconds'),
        ('timeout=0', 'timeout must be a positive number of seconds'),
        ('command_timeout=-1', 'command_timeout must be a positive number of seconds'),
        ('command_timeout=inf', 'command_timeout must be a positive number of seconds'),
        ('connect_timeout=soon', 'connect_timeout must be a positive number of seconds'),
        ('timeout=1&timeout=2', 'timeout is given 2 times'),
        ('timeout=1&connect_timeout=2', 'timeout or connect_timeout, not both'),
    ],
)
def test_a_bad_postgres_timeout_names_the_parameter_without_the_password(query: str, message: str) -> None:
    with pytest.raises(ValueError, match=message) as raised:
        PostgresStepStore(f'postgresql://app:hunter2@db.example/runs?{query}')
    assert 'hunter2' not in str(raised.value)


async def test_the_password_never_shows_in_the_stores_repr() -> None:
    store = PostgresStepStore('postgresql://app:hunter2@127.0.0.1:1/runs')
    try:
        assert 'hunter2' not in repr(store) and '***' in repr(store)
    finally:
        await store.aclose()


async def test_front_doors_refuse_the_other_dialect(tmp_path: Path) -> None:
    engine = create_async_engine(f'sqlite+aiosqlite:///{tmp_path / "x.db"}')
    try:
        with pytest.raises(ValueError, match='PostgreSQL'):
            PostgresStepStore(engine)
        with pytest.raises(ValueError, match='PostgreSQL'):
            PostgresStepStore('sqlite:///x.db')
        with pytest.raises(ValueError, match='only supported on PostgreSQL'):
            SqlStepStore(engine, schema='steps')
    finally:
        await engine.dispose()
    with pytest.raises(TypeError, match='not both'):
        SqliteStepStore(tmp_path / 'y.db', connection=object())  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ('options', 'error', 'message'),
    [
        ({'media_threshold_bytes': 0}, ValueError, 'threshold_bytes'),
        ({'media_threshold_bytes': 1.5}, ValueError, 'threshold_bytes'),
        ({'media_store': 'disk'}, TypeError, 'media_store'),
        ({'max_snapshots_per_run': 0}, ValueError, 'max_snapshots_per_run'),
    ],
)
def test_invalid_options_are_rejected(
    tmp_path: Path, options: dict[str, object], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        SqliteStepStore(tmp_path / 'options.db', **options)  # type: ignore[arg-type]


def test_without_asyncpg_the_package_imports_and_postgres_names_the_extra(tmp_path: Path) -> None:
    (tmp_path / 'asyncpg.py').write_text("raise ImportError('asyncpg is not installed here')\n")
    script = (
        'import step_persistence\n'
        'try:\n'
        "    step_persistence.PostgresStepStore('postgresql://127.0.0.1/runs')\n"
        'except ImportError as error:\n'
        '    print(error)\n'
    )
    completed = subprocess.run(
        [sys.executable, '-c', script],
        env={**os.environ, 'PYTHONPATH': str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert completed.returncode == 0, completed.stderr
    assert 'step-persistence[postgres]' in completed.stdout
