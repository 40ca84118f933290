"""Write tests/harness_data/ with pydantic-ai-harness itself: its file store, SQLite, PostgreSQL and MongoDB.

Run it from the repository root (see README.md beside this file):

    cd tests/harness_data && uv run --locked python generate.py

pydantic-ai-harness is used as a black box: agents on a `FunctionModel` with its capability, its
stores and its helpers, nothing else. Every backend gets the same runs (`SCENARIO` below):

- a conversation of two orchestrator turns, the second continuing the first (`continue_run`), each
  delegating to a librarian agent (a child run, `parent_run_id` set by the harness) and setting a
  label through a tool that annotates its effect (`annotate_tool_effect`);
- a run with media: an image above the media threshold (externalized), a small one (inline), a
  tool returning a text above the threshold (externalized as text);
- a failed run: a tool raises in the middle of a tool cycle (an `interrupted` snapshot, a failed effect);
- a crashed run: a child process dies (`os._exit`) inside a tool after annotating its effect (an
  effect left `started`, no terminal event);
- on file, SQLite and PostgreSQL, first of all, a run written by pydantic-ai-harness 0.58 (the
  environment in `older/`), whose binary marker is the older shape, before 0.62 opens the store.

PostgreSQL is kept as `pg_dump` output (`postgres/dump.sql`), MongoDB as the documents of each
collection in canonical extended JSON plus the indexes (`mongo/*.json`): the tests load them
into the servers they start. Both servers are started here the way the test suite starts them
(tests/support/servers).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pydantic_ai_harness.step_persistence as harness
from payloads import CONVERSATION, CRASHED_RUN, ICON, IMAGE, OLD_IMAGE, REPORT
from pydantic_ai import Agent, BinaryContent, RunContext
from pydantic_ai.messages import ModelRequest, ModelResponse, TextPart, ToolCallPart, UserPromptPart
from pydantic_ai.models.function import FunctionModel

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]

# --- scripted models ---


def _model(steps: list[Any]) -> Any:
    """A model answering the n-th request since the latest user prompt with `steps[n]` (the last repeats)."""

    def respond(messages: list[Any], info: Any) -> Any:
        prompts = [
            index
            for index, message in enumerate(messages)
            if isinstance(message, ModelRequest) and any(isinstance(part, UserPromptPart) for part in message.parts)
        ]
        answered = sum(isinstance(message, ModelResponse) for message in messages[prompts[-1] :])
        step = steps[min(answered, len(steps) - 1)]
        return step(messages) if callable(step) else step

    return FunctionModel(respond)


def _calls(*calls: tuple[str, dict[str, Any], str]) -> Any:

    return ModelResponse(parts=[ToolCallPart(name, args, call_id) for name, args, call_id in calls])


def _text(content: str) -> Any:

    return ModelResponse(parts=[TextPart(content)])


# --- the harness's stores ---


@contextlib.asynccontextmanager
async def harness_store(backend: str, location: str) -> AsyncIterator[Any]:
    """A pydantic-ai-harness store on `backend` at `location` (a path, a PostgreSQL DSN, a MongoDB URI)."""

    if backend == 'file':
        yield harness.FileStepStore(location)
    elif backend == 'sqlite':
        store = harness.SqliteStepStore(database=location)
        try:
            yield store
        finally:
            close = getattr(store, 'aclose', None)
            if close is not None:
                await close()
    elif backend == 'postgres':
        import asyncpg

        pool = await asyncpg.create_pool(location, min_size=1, max_size=4)
        try:
            yield harness.PostgresStepStore(pool)
        finally:
            await pool.close()
    elif backend == 'mongo':
        uri, _, database = location.rpartition('/')
        store = harness.MongoStepStore(db_url=uri, database=database)
        try:
            yield store
        finally:
            await store.aclose()
    else:
        raise ValueError(backend)


# --- the runs ---


async def conversation(store: Any) -> None:
    """Two orchestrator turns of one conversation, each delegating to the librarian and setting a label."""

    librarian = Agent(
        _model([_calls(('grep', {'symbol': 'ThinkingPartDelta'}, 'grep-1')), _text('defined in messages.py')]),
        capabilities=[harness.StepPersistence(store=store, agent_name='code_librarian')],
    )

    @librarian.tool_plain
    def grep(symbol: str) -> str:
        return f'pydantic_ai/messages.py:1200: class {symbol}'

    orchestrator = Agent(
        _model(
            [
                _calls(('ask_librarian', {'question': 'Where is ThinkingPartDelta?'}, 'ask-1')),
                _calls(('set_label', {'issue': 7, 'label': 'investigated'}, 'label-1')),
                _text('ThinkingPartDelta is in messages.py; issue 7 labelled.'),
            ]
        ),
        capabilities=[harness.StepPersistence(store=store, agent_name='orchestrator', metadata={'team': 'docs'})],
    )

    @orchestrator.tool_plain
    async def ask_librarian(question: str) -> str:
        result = await librarian.run(question)
        return result.output

    @orchestrator.tool
    async def set_label(ctx: RunContext[None], issue: int, label: str) -> str:
        await harness.annotate_tool_effect(
            store,
            ctx,
            idempotency_key=f'issue-{issue}::label::{label}',
            effect_summary=f'set label {label!r} on #{issue}',
        )
        return 'ok'

    await orchestrator.run('Where is ThinkingPartDelta defined? Label issue 7.', conversation_id=CONVERSATION)
    first = (await store.list_runs(conversation_id=CONVERSATION))[-1].run_id
    history = await harness.continue_run(store, run_id=first)
    await orchestrator.run('And check the callable allowance.', message_history=history, conversation_id=CONVERSATION)


async def media(store: Any) -> None:
    """Images in the prompt (one externalized, one inline) and a large text tool return (externalized)."""

    agent = Agent(
        _model([_calls(('read_report', {}, 'report-1')), _text('The screenshot matches the report.')]),
        capabilities=[harness.StepPersistence(store=store, agent_name='reviewer')],
    )

    @agent.tool_plain
    def read_report() -> str:
        return REPORT

    await agent.run(
        [
            'Does this screenshot match the report?',
            BinaryContent(IMAGE, media_type='image/png'),
            BinaryContent(ICON, media_type='image/gif'),
        ],
        conversation_id='review-conv',
    )


async def failed(store: Any) -> None:
    """A tool raises while another call of the same cycle returned: the run fails, interrupted."""

    agent = Agent(
        _model([_calls(('fetch', {'url': 'https://example.invalid/a'}, 'fetch-1'), ('explode', {}, 'explode-1'))]),
        capabilities=[harness.StepPersistence(store=store, agent_name='fetcher')],
    )

    @agent.tool_plain
    def fetch(url: str) -> str:
        return f'contents of {url}'

    @agent.tool_plain
    def explode() -> str:
        raise RuntimeError('the disk is full')

    with contextlib.suppress(RuntimeError):
        await agent.run('Fetch page a and clean up.', conversation_id='fetch-conv')


async def crash(store: Any) -> None:
    """Dies inside a tool after annotating its effect: the process ends with the effect `started`."""

    agent = Agent(
        _model([_calls(('deploy', {'service': 'billing'}, 'deploy-1'))]),
        capabilities=[harness.StepPersistence(store=store, agent_name='deployer', run_id=CRASHED_RUN)],
    )

    @agent.tool
    async def deploy(ctx: RunContext[None], service: str) -> str:
        await harness.annotate_tool_effect(
            store, ctx, idempotency_key=f'deploy::{service}', effect_summary=f'deploy {service} to production'
        )
        os._exit(3)

    await agent.run('Deploy billing.', conversation_id='deploy-conv')


async def older(store: Any) -> None:
    """What pydantic-ai-harness 0.58 writes: an externalized image in the binary marker's older shape."""

    agent = Agent(_model([_text('An older screenshot.')]), capabilities=[harness.StepPersistence(store=store)])
    await agent.run(['What is on this screenshot?', BinaryContent(OLD_IMAGE, media_type='image/jpeg')])


SCENARIO = (conversation, media, failed)


async def _write(backend: str, location: str, *runs: Any) -> None:
    async with harness_store(backend, location) as store:
        for scenario in runs:
            await scenario(store)


def _in_child(command: str, backend: str, location: str, *, environment: Path = HERE) -> int:
    """Run `generate.py COMMAND BACKEND LOCATION` in a new process of `environment`'s uv project."""
    uv = os.environ.get('UV') or shutil.which('uv') or 'uv'  # `uv run` names itself in UV
    script = [str(HERE / 'generate.py'), command, backend, location]
    completed = subprocess.run(
        [uv, 'run', '--locked', '--quiet', '--project', str(environment), 'python', *script],
        cwd=environment,
        check=False,
    )
    return completed.returncode


def write_backend(backend: str, location: str) -> None:
    """Every run of the scenario on one backend: the older release's first, the crash last."""
    if backend != 'mongo' and _in_child('older', backend, location, environment=HERE / 'older') != 0:
        raise RuntimeError(f'the older release failed on {backend}')
    asyncio.run(_write(backend, location, *SCENARIO))
    if _in_child('crash', backend, location) != 3:
        raise RuntimeError(f'the crashing run did not crash on {backend}')


# --- servers and dumps ---


@contextlib.contextmanager
def servers(root: Path) -> Iterator[tuple[Any, Any]]:
    sys.path.insert(0, str(ROOT / 'tests'))
    from support.servers.mongo import mongo_server
    from support.servers.postgres import postgres_server

    class Paths:
        def mktemp(self, name: str) -> Path:
            return Path(tempfile.mkdtemp(prefix=name, dir=root))

    with (
        contextlib.contextmanager(postgres_server.__wrapped__)() as postgres,
        contextlib.contextmanager(mongo_server.__wrapped__)(Paths()) as mongo,
    ):
        yield postgres, mongo


def dump_postgres(port: int, database: str, target: Path) -> None:
    """The database as SQL statements (`pg_dump --inserts`), without psql's meta-commands."""
    import glob

    pg_dump = sorted(glob.glob('/usr/lib/postgresql/*/bin/pg_dump'))[-1]
    command = [pg_dump, '--inserts', '--no-owner', '--no-privileges', '-h', '127.0.0.1', '-p', str(port)]
    dumped = subprocess.run([*command, '-U', 'postgres', database], capture_output=True, text=True, check=True).stdout
    lines = [line for line in dumped.splitlines() if not line.startswith('\\')]
    target.write_text('\n'.join(lines) + '\n')


def dump_mongo(uri: str, database: str, target: Path) -> None:
    """Each collection's documents (canonical extended JSON, in `_id` order) and indexes."""
    from bson import json_util
    from pymongo import MongoClient

    client: Any = MongoClient(uri)
    try:
        db = client[database]
        for name in sorted(db.list_collection_names()):
            dumped = {
                'indexes': [dict(index) for index in db[name].list_indexes()],
                'documents': list(db[name].find({}).sort('_id', 1)),
            }
            text = json_util.dumps(dumped, json_options=json_util.CANONICAL_JSON_OPTIONS, indent=1)
            (target / f'{name}.json').write_text(text + '\n')
    finally:
        client.close()


def single_file(database: Path) -> None:
    """Fold the WAL into the database file, so the fixture is one file."""
    connection = sqlite3.connect(database)
    try:
        connection.execute('PRAGMA wal_checkpoint(TRUNCATE)')
        connection.execute('PRAGMA journal_mode=DELETE')
    finally:
        connection.close()


def generate() -> None:
    import asyncpg

    for name in ('file', 'sqlite', 'postgres', 'mongo'):
        shutil.rmtree(HERE / name, ignore_errors=True)
        (HERE / name).mkdir()
    with tempfile.TemporaryDirectory() as scratch, servers(Path(scratch)) as (postgres, mongo):
        write_backend('file', str(HERE / 'file' / 'runs'))
        write_backend('sqlite', str(HERE / 'sqlite' / 'runs.db'))
        single_file(HERE / 'sqlite' / 'runs.db')

        async def create(name: str) -> None:
            connection = await asyncpg.connect(host='127.0.0.1', port=postgres.port, user='postgres')
            try:
                await connection.execute(f'CREATE DATABASE {name}')
            finally:
                await connection.close()

        asyncio.run(create('harness'))
        write_backend('postgres', f'postgresql://postgres@127.0.0.1:{postgres.port}/harness')
        dump_postgres(postgres.port, 'harness', HERE / 'postgres' / 'dump.sql')
        write_backend('mongo', f'{mongo.uri.rstrip("/").split("?")[0]}/harness')
        dump_mongo(mongo.uri, 'harness', HERE / 'mongo')
    versions = {name: _version(name) for name in ('pydantic-ai-harness', 'pydantic-ai-slim')}
    (HERE / 'versions.json').write_text(json.dumps(versions, indent=1) + '\n')


def _version(name: str) -> str:
    from importlib.metadata import version

    return version(name)


def main(argv: list[str]) -> None:
    if not argv:
        generate()
        return
    command, backend, location = argv
    scenario = {'older': older, 'crash': crash}[command]
    asyncio.run(_write(backend, location, scenario))


if __name__ == '__main__':
    main(sys.argv[1:])
