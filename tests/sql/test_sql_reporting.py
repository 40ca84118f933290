"""The reporting views against the Python figures, the queries of docs/reporting.md, and `report`.

One database per dialect for the whole module, written by real agents (`reporting_runs.py`).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select, text
from sqlalchemy.ext.asyncio import create_async_engine

from step_persistence import RunRecord, SqlStepStore, StepEvent, TokenUsage, from_spec
from step_persistence.cli._common import print_json
from step_persistence.records import TOKEN_COUNT_MAX
from step_persistence.reporting import summarize_runs, tool_stats
from step_persistence.stores.sql.reporting import read_report, run_summary
from support.console_script import cli
from support.databases import EmptyDatabase
from support.reporting_runs import ORCHESTRATOR_RUN, populate
from support.servers.postgres import PostgresServer

pytestmark = pytest.mark.anyio
PAGE = Path(__file__).resolve().parents[2] / 'docs' / 'reporting.md'
SQL_BLOCK = re.compile(r'^```sql\n(.*?)^```', re.MULTILINE | re.DOTALL)
ONLY_ON = re.compile(r'^-- (postgresql|sqlite):')


@dataclass(frozen=True)
class ReportedDatabase:
    dialect: str
    url: str
    """The async SQLAlchemy URL."""
    store_url: str
    """The `--store` URL of the command line."""
    spec: dict[str, Any]


@pytest.fixture(scope='module')
def anyio_backend() -> str:
    return 'asyncio'


@pytest.fixture(scope='module', params=['sqlite', 'postgresql'])
async def reported(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[ReportedDatabase]:
    """A database per dialect holding every kind of run, shared by the module's tests."""
    if request.param == 'sqlite':
        path = tmp_path_factory.mktemp('reporting') / 'runs.db'
        database = ReportedDatabase(
            'sqlite', f'sqlite+aiosqlite:///{path}', f'sqlite:///{path}', {'backend': 'sqlite', 'database': str(path)}
        )
        await populate(database.spec)
        yield database
        return
    server: PostgresServer = request.getfixturevalue('postgres_server')
    name = await server.create_database()
    url = server.url(name)
    try:
        database = ReportedDatabase('postgresql', url, url, {'backend': url})
        await populate(database.spec)
        yield database
    finally:
        await server.drop_database(name)


async def test_the_views_give_the_python_figures(reported: ReportedDatabase) -> None:
    async with from_spec(**reported.spec) as store:
        assert isinstance(store, SqlStepStore)
        expected = (await summarize_runs(store), await tool_stats(store))
        summaries, stats = await read_report(store)
    assert (summaries, stats) == expected

    by_run = {summary.run_id: summary for summary in summaries}
    assert Counter(summary.status for summary in summaries) == {'completed': 3, 'failed': 1, 'crashed': 2, 'running': 2}
    assert by_run['stale-run'].status == 'crashed' and by_run['stale-run'].unresolved_effects == 0
    [worker] = [s for s in summaries if s.status == 'crashed' and s.unresolved_effects]
    assert (worker.agent_name, worker.ended_at, worker.duration_seconds) == ('worker', None, None)
    [mailer] = [s for s in summaries if s.agent_name == 'mailer']
    assert (mailer.status, mailer.tool_failures, mailer.snapshots, mailer.latest_snapshot_state) == (
        'failed',
        2,
        3,
        'interrupted',
    )
    assert by_run['idle-run'].model_requests == 0 and by_run['idle-run'].latest_snapshot_state is None
    tools = {row.tool_name: row for row in stats}
    assert (tools['lookup'].calls, tools['lookup'].failures) == (2, 1)
    assert (tools['charge_card'].unresolved, tools['send_mail'].failures, tools['search'].calls) == (1, 1, 2)
    settled = [row for row in stats if row.calls > row.unresolved]
    assert settled and all(row.max_seconds is not None and row.max_seconds > 0 for row in settled)
    assert tools['charge_card'].mean_seconds is None and tools['charge_card'].total_seconds == 0.0


async def test_the_views_answer_queries_of_their_own(reported: ReportedDatabase) -> None:
    engine = create_async_engine(reported.url)
    try:
        async with engine.connect() as connection:
            failed = select(run_summary.c.agent_name, run_summary.c.ended_at).where(run_summary.c.status == 'failed')
            [(agent, ended_at)] = (await connection.execute(failed)).all()
    finally:
        await engine.dispose()
    assert agent == 'mailer' and ended_at.tzinfo is not None


def doc_queries() -> list[str]:
    found = SQL_BLOCK.findall(PAGE.read_text())
    assert len(found) >= 6
    return found


async def test_every_query_of_the_docs_page_runs_and_finds_rows(reported: ReportedDatabase) -> None:
    engine = create_async_engine(reported.url)
    ran = 0
    try:
        async with engine.connect() as connection:
            for query in doc_queries():
                only_on = ONLY_ON.match(query)
                if only_on and only_on.group(1) != reported.dialect:
                    continue
                rows = (await connection.execute(text(query))).all()
                assert rows, f'no rows from:\n{query}'
                if 'WITH RECURSIVE' in query:
                    assert [(row.depth, row.agent_name) for row in rows] == [
                        (0, 'orchestrator'),
                        (1, 'researcher'),
                        (2, 'librarian'),
                    ]
                    assert rows[0].run_id == ORCHESTRATOR_RUN
                ran += 1
    finally:
        await engine.dispose()
    assert ran == len(doc_queries()) - 1


async def test_report_prints_the_view_figures_as_the_python_ones(
    reported: ReportedDatabase, capsys: pytest.CaptureFixture[str]
) -> None:
    async with from_spec(**reported.spec) as store:
        print_json({'runs': await summarize_runs(store), 'tools': await tool_stats(store)})
    expected = json.loads(capsys.readouterr().out)
    assert json.loads(cli('report', '--store', reported.store_url, '--json').stdout) == expected


async def test_the_token_queries_of_the_docs_add_up_to_the_run_summaries(reported: ReportedDatabase) -> None:
    async with from_spec(**reported.spec) as store:
        summaries = await summarize_runs(store)
    expected: Counter[tuple[str | None, str]] = Counter()
    for summary in summaries:
        expected[(summary.agent_name, 'input')] += summary.input_tokens
        expected[(summary.agent_name, 'output')] += summary.output_tokens
    per_agent = next(query for query in doc_queries() if 'cached_input_tokens' in query)
    per_model = next(query for query in doc_queries() if 'e.model_name' in query)
    engine = create_async_engine(reported.url)
    try:
        async with engine.connect() as connection:
            agents = (await connection.execute(text(per_agent))).all()
            models = (await connection.execute(text(per_model))).all()
    finally:
        await engine.dispose()
    assert {(row.agent_name, 'input'): row.input_tokens for row in agents} | {
        (row.agent_name, 'output'): row.output_tokens for row in agents
    } == dict(expected)
    assert expected[('orchestrator', 'input')] > 0, 'the agents reported usage'
    by_model: Counter[tuple[str | None, str]] = Counter()
    for row in models:
        assert row.model_name and row.responses > 0
        by_model[(row.agent_name, 'input')] += row.input_tokens
        by_model[(row.agent_name, 'output')] += row.output_tokens
    assert +by_model == +expected


async def test_token_totals_beyond_64_bits_are_computed_through_the_protocol(empty_database: EmptyDatabase) -> None:
    most = TokenUsage(input_tokens=TOKEN_COUNT_MAX, output_tokens=1, cache_read_tokens=0, cache_write_tokens=0)
    async with SqlStepStore(empty_database.url) as store:
        await store.register_run(RunRecord(run_id='huge'))
        for step in (1, 2):
            await store.append_event(
                StepEvent(run_id='huge', kind='model_request_completed', step_index=step, model_name='m', usage=most)
            )
        [summary], _ = await read_report(store)
    assert (summary.input_tokens, summary.output_tokens) == (2 * TOKEN_COUNT_MAX, 2)
