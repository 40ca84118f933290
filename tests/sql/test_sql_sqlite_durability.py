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
        settings = await store._db.run(
            lambda transaction: [
                transaction.connection.exec_driver_sql(f'PRAGMA {name}').scalar()
                for name in ('journal_mode', 'synchronous')
            ],
            write=False,
        )
        assert settings == ['wal', pragma_value]
    finally:
        await store.aclose()


def test_bad_synchronous_values_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match='synchronous'):
        SqliteStepStore(tmp_path / 'runs.db', synchronous='OFF')  # type: ignore[arg-type]
