"""SQLite durability settings of the stores' own engines."""

from __future__ import annotations

from pathlib import Path

import pytest

from step_persistence import RunRecord, SqliteStepStore

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize(('setting', 'pragma_value'), [(None, 1), ('NORMAL', 1), ('FULL', 2)])
async def test_synchronous_setting_reaches_every_connection(
    tmp_path: Path, setting: str | None, pragma_value: int
) -> None:
    options = {} if setting is None else {'synchronous': setting}
    store = SqliteStepStore(tmp_path / 'runs.db', **options)  # type: ignore[arg-type]
    try:
        await store.register_run(RunRecord(run_id='r'))
        async with store._db.transaction(write=False) as connection:
            journal = (await connection.exec_driver_sql('PRAGMA journal_mode')).scalar()
            synchronous = (await connection.exec_driver_sql('PRAGMA synchronous')).scalar()
        assert (journal, synchronous) == ('wal', pragma_value)
    finally:
        await store.aclose()


def test_bad_synchronous_values_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match='synchronous'):
        SqliteStepStore(tmp_path / 'runs.db', synchronous='OFF')  # type: ignore[arg-type]
