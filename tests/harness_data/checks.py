"""The data pydantic-ai-harness wrote (this directory), put where the tests read it, and what must come back.

`place_*` put one backend's data in a test's own place: a copy of the file store or of the SQLite
file, the PostgreSQL dump run into a fresh database, the MongoDB documents and indexes inserted into
a fresh database. `RawCounts` are the items as the harness stored them, counted without our code;
`check_scenario` asserts that a store of ours (or a harness store read through ours) holds every run
`generate.py` wrote, whole.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic_ai.messages import BinaryContent, ModelMessage, ToolReturnPart, UserPromptPart

from harness_data.payloads import CONVERSATION, CRASHED_RUN, ICON, IMAGE, OLD_IMAGE, REPORT
from step_persistence import StepStore

HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class RawCounts:
    """What the harness stored, counted on its own terms."""

    runs: int
    events: int
    snapshots: int
    effects: int
    older_release: bool
    """Whether pydantic-ai-harness 0.58 wrote a run there first (not on MongoDB: it had no MongoDB store)."""


def place_file_store(target: Path) -> Path:
    shutil.copytree(HERE / 'file' / 'runs', target)
    return target


def place_sqlite(target: Path) -> Path:
    shutil.copyfile(HERE / 'sqlite' / 'runs.db', target)
    return target


def file_counts(directory: Path) -> RawCounts:
    runs = [path for path in directory.iterdir() if (path / 'run.json').is_file()]

    def lines(path: Path) -> list[dict[str, Any]]:
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    return RawCounts(
        runs=len(runs),
        events=sum(len(lines(run / 'events.jsonl')) for run in runs),
        snapshots=sum(len(list((run / 'snapshots').glob('*.json'))) for run in runs if (run / 'snapshots').is_dir()),
        effects=sum(len({line['tool_call_id'] for line in lines(run / 'tool_effects.jsonl')}) for run in runs),
        older_release=True,
    )


def sql_counts(rows: dict[str, int]) -> RawCounts:
    return RawCounts(rows['runs'], rows['events'], rows['snapshots'], rows['tool_effects'], older_release=True)


def sqlite_counts(path: Path, prefix: str = '') -> RawCounts:
    connection = sqlite3.connect(path)
    try:
        tables = ('runs', 'events', 'snapshots', 'tool_effects')
        return sql_counts(
            {name: connection.execute(f'SELECT count(*) FROM {prefix}{name}').fetchone()[0] for name in tables}
        )
    finally:
        connection.close()


async def place_postgres(port: int, database: str) -> RawCounts:
    """Run the harness's PostgreSQL dump in `database` (empty); the rows it holds."""
    import asyncpg

    connection = await asyncpg.connect(host='127.0.0.1', port=port, user='postgres', database=database)
    try:
        await connection.execute((HERE / 'postgres' / 'dump.sql').read_text())
        tables = ('runs', 'events', 'snapshots', 'tool_effects')
        rows = {
            name: await connection.fetchval(f'SELECT count(*) FROM public.step_persistence_{name}') for name in tables
        }
    finally:
        await connection.close()
    return sql_counts(rows)


def place_mongo(uri: str, database: str) -> RawCounts:
    """Insert the harness's MongoDB documents and indexes into `database` (empty); what it holds."""
    from bson import json_util
    from pymongo import MongoClient

    client: Any = MongoClient(uri)
    try:
        db = client[database]
        for path in sorted((HERE / 'mongo').glob('*.json')):
            dumped = json_util.loads(path.read_text())
            if dumped['documents']:
                db[path.stem].insert_many(dumped['documents'])
            indexes = [{key: value for key, value in index.items() if key != 'v'} for index in dumped['indexes']]
            indexes = [index for index in indexes if index['name'] != '_id_']
            if indexes:
                db.command({'createIndexes': path.stem, 'indexes': indexes})
        effects = {(effect['run_id'], effect['tool_call_id']) for effect in db.tool_effects.find({})}
        return RawCounts(
            runs=db.runs.count_documents({}),
            events=db.events.count_documents({}),
            snapshots=db.snapshots.count_documents({}),
            effects=len(effects),
            older_release=False,
        )
    finally:
        client.close()


def tree_digest(path: Path) -> str:
    """One digest of every file under `path` (or of the file), names and bytes: it changes if anything is written."""
    digest = hashlib.sha256()
    for file in sorted([path] if path.is_file() else path.rglob('*')):
        if file.is_file():
            digest.update(str(file.relative_to(path.parent)).encode() + b'\0' + file.read_bytes())
    return digest.hexdigest()


def _payloads(messages: list[ModelMessage]) -> list[object]:
    """The images and the tool's text return of a history, in order."""
    found: list[object] = []
    for message in messages:
        for part in message.parts:
            if isinstance(part, UserPromptPart) and not isinstance(part.content, str):
                found += [item.data for item in part.content if isinstance(item, BinaryContent)]
            if isinstance(part, ToolReturnPart) and part.tool_name == 'read_report':
                found.append(part.content)
    return found


async def check_scenario(store: StepStore, counts: RawCounts) -> None:
    """Every run `generate.py` wrote is in `store`, whole: lineage, events, effects with their
    annotations, snapshots in both states, media restored byte for byte."""
    runs = await store.list_runs()
    assert len(runs) == counts.runs
    events = [await store.list_events(run_id=run.run_id) for run in runs]
    snapshots = [await store.list_snapshots(run_id=run.run_id, include_interrupted=True) for run in runs]
    effects = [await store.list_tool_effects(run_id=run.run_id) for run in runs]
    assert sum(map(len, events)) == counts.events
    assert sum(map(len, snapshots)) == counts.snapshots
    assert sum(map(len, effects)) == counts.effects
    by_agent: dict[str | None, list[str]] = {}
    for run in runs:
        by_agent.setdefault(run.agent_name, []).append(run.run_id)

    # Lineage: two turns of one conversation, each delegating to the librarian.
    turns = await store.list_runs(conversation_id=CONVERSATION)
    assert [turn.agent_name for turn in turns] == ['orchestrator', 'orchestrator']
    assert all(turn.metadata == {'team': 'docs'} for turn in turns)
    for turn in turns:
        delegates = await store.list_runs(parent_run_id=turn.run_id)
        assert [delegate.agent_name for delegate in delegates] == ['code_librarian']
        label = await store.get_tool_effect(run_id=turn.run_id, tool_call_id='label-1')
        assert label is not None and label.status == 'completed'
        assert (label.idempotency_key, label.effect_summary) == (
            'issue-7::label::investigated',
            "set label 'investigated' on #7",
        )
    second = await store.latest_snapshot(run_id=turns[1].run_id)
    first = await store.latest_snapshot(run_id=turns[0].run_id)
    assert first is not None and second is not None
    assert len(second.messages) > len(first.messages)  # the second turn continued the first's history

    # The crashed run: its effect still started, annotated, no terminal event, no snapshot.
    unresolved = await store.list_unresolved_tool_effects(run_id=CRASHED_RUN)
    assert [(effect.tool_name, effect.idempotency_key, effect.effect_summary) for effect in unresolved] == [
        ('deploy', 'deploy::billing', 'deploy billing to production')
    ]
    assert (await store.list_events(run_id=CRASHED_RUN))[-1].kind == 'tool_call_started'
    assert await store.list_snapshots(run_id=CRASHED_RUN, include_interrupted=True) == []

    # The failed run: an interrupted snapshot only, a failed effect beside a completed one.
    [failed] = by_agent['fetcher']
    assert await store.latest_snapshot(run_id=failed) is None
    interrupted = await store.latest_snapshot(run_id=failed, include_interrupted=True)
    assert interrupted is not None and interrupted.state == 'interrupted'
    assert {effect.tool_name: effect.status for effect in await store.list_tool_effects(run_id=failed)} == {
        'fetch': 'completed',
        'explode': 'failed',
    }
    assert (await store.list_events(run_id=failed))[-1].kind == 'run_failed'

    # Media: the externalized image and text, the inline icon; the older release's image.
    [reviewer] = by_agent['reviewer']
    reviewed = await store.latest_snapshot(run_id=reviewer)
    assert reviewed is not None
    assert _payloads(reviewed.messages) == [IMAGE, ICON, REPORT]
    if counts.older_release:
        [older] = by_agent['agent']
        described = await store.latest_snapshot(run_id=older)
        assert described is not None
        assert _payloads(described.messages) == [OLD_IMAGE]
