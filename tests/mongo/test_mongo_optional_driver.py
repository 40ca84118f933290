"""Without the `mongodb` extra the package still imports, and the Mongo stores name the extra to install."""

from __future__ import annotations

import json
import subprocess
import sys

SCRIPT = """
import importlib.abc, json, sys

class WithoutDriver(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition('.')[0] in {'pymongo', 'motor', 'bson', 'gridfs'}:
            raise ImportError(f'No module named {name!r}')
        return None

sys.meta_path.insert(0, WithoutDriver())
import step_persistence
from step_persistence import InMemoryStepStore, from_spec
from step_persistence.media import DiskMediaStore

errors = {}
attempts = {
    'store': lambda: step_persistence.MongoStepStore,
    'media': lambda: __import__('step_persistence.media', fromlist=['MongoMediaStore']).MongoMediaStore,
    'spec': lambda: from_spec('mongodb://127.0.0.1:1/db'),
}
for name, attempt in attempts.items():
    try:
        attempt()
    except ImportError as error:
        errors[name] = str(error)
print(json.dumps(errors))
"""


def test_the_package_imports_without_pymongo_and_names_the_extra() -> None:
    completed = subprocess.run([sys.executable, '-c', SCRIPT], capture_output=True, text=True, timeout=120)
    assert completed.returncode == 0, completed.stderr
    errors = json.loads(completed.stdout)
    assert sorted(errors) == ['media', 'spec', 'store']
    assert all('pip install "step-persistence[mongodb]"' in message for message in errors.values()), errors
