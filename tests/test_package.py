"""The package's public surface: names, lazy imports, optional drivers."""

from __future__ import annotations

import subprocess
import sys

import step_persistence
from step_persistence.spec import redact_url

WITHOUT_DRIVERS = """
import sys
for name in ('asyncpg', 'pymongo', 'motor'):
    sys.modules[name] = None  # importing any of them now raises ImportError
import step_persistence
from step_persistence import InMemoryStepStore, StepPersistence, SqliteStepStore, FileStepStore
from step_persistence.media import DiskMediaStore, MediaContext
for build, extra in (
    (lambda: step_persistence.PostgresStepStore('postgresql://u@127.0.0.1/db'), 'step-persistence[postgres]'),
    (lambda: step_persistence.MongoStepStore(db_url='mongodb://h/x', database='x'), 'step-persistence[mongodb]'),
):
    try:
        build()
    except ImportError as error:
        assert extra in str(error), error
    else:
        raise AssertionError(f'expected an ImportError naming {extra}')
print('ok')
"""


def test_public_names_resolve() -> None:
    assert set(step_persistence.__all__) == set(step_persistence._MODULES)
    for name in step_persistence.__all__:
        assert getattr(step_persistence, name) is not None
    assert set(dir(step_persistence)) >= set(step_persistence.__all__)


def test_core_works_without_optional_drivers() -> None:
    completed = subprocess.run([sys.executable, '-c', WITHOUT_DRIVERS], capture_output=True, text=True, timeout=120)
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.strip() == 'ok'


def test_import_does_not_load_drivers_or_stores() -> None:
    drivers = ('asyncpg', 'pymongo', 'sqlalchemy', 'alembic')
    probe = f'import sys, step_persistence; print(sorted(m for m in {drivers!r} if m in sys.modules))'
    completed = subprocess.run([sys.executable, '-c', probe], capture_output=True, text=True, timeout=120)
    assert completed.stdout.strip() == '[]', completed.stderr


def test_redact_url_hides_passwords_only() -> None:
    assert redact_url('postgresql://scott:tiger@db:5432/x') == 'postgresql://scott:***@db:5432/x'
    assert redact_url('mongodb+srv://u:p%40ss@cluster/db?x=1') == 'mongodb+srv://u:***@cluster/db?x=1'
    assert redact_url('sqlite:///runs.db') == 'sqlite:///runs.db'
    assert redact_url('error at postgresql://a:b@h/d and more') == 'error at postgresql://a:***@h/d and more'
