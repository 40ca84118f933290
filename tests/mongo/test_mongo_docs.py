"""The examples of docs/mongo.md run as written, in order, against the test server (in a fresh database)."""

from __future__ import annotations

import re
import runpy
import uuid
from pathlib import Path
from typing import Any

import pytest
from pymongo import MongoClient

from support.servers.mongo import MongoServer

PAGE = Path(__file__).resolve().parents[2] / 'docs' / 'mongo.md'
EXAMPLE = re.compile(r'^```py\n(.*?)^```', re.MULTILINE | re.DOTALL)
DOCUMENTED_URL = 'mongodb://localhost:27017'
DOCUMENTED_DATABASE = 'agents'


def test_the_examples_run_against_the_server(
    mongo_server: MongoServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    examples = EXAMPLE.findall(PAGE.read_text())
    assert len(examples) == 4
    database = f'test_docs_{uuid.uuid4().hex[:12]}'
    monkeypatch.chdir(tmp_path)
    try:
        for index, code in enumerate(examples):
            code = code.replace(f'{DOCUMENTED_URL}/{DOCUMENTED_DATABASE}', mongo_server.uri_for(database))
            code = code.replace(DOCUMENTED_URL, mongo_server.uri).replace(f"'{DOCUMENTED_DATABASE}'", f"'{database}'")
            script = tmp_path / f'example_{index}.py'
            script.write_text(code)
            runpy.run_path(str(script), run_name='__main__')
    finally:
        client: MongoClient[Any] = MongoClient(mongo_server.uri)
        client.drop_database(database)
        client.close()
