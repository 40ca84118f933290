"""What each page shows, read in a real browser (headless Chromium), on records written through the protocol
with known times, tokens and parts: every cell of a run's row and every status badge, the timeline's
durations, models, tokens, arguments, results and ledger statuses, the copy buttons, every kind of
message part (long ones collapsed, images from the media store inline, other media as links),
pages that keep to the Content-Security-Policy, and a visit with a token.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from playwright.sync_api import Browser, BrowserContext, ConsoleMessage, Error, Page, expect
from pydantic_ai.messages import (
    BinaryContent,
    ModelMessage,
    ModelRequest,
    ModelResponse,
    RequestUsage,
    SystemPromptPart,
    TextPart,
    ThinkingPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)

from step_persistence import (
    ContinuableSnapshot,
    InMemoryStepStore,
    RunRecord,
    SqliteStepStore,
    StepEvent,
    StepStore,
    ToolEffectRecord,
)
from step_persistence.inspector.media import blob_digest
from step_persistence.inspector.pages import when
from step_persistence.protocol import write_steps
from step_persistence.records import StepWrites, TokenUsage, utc_now
from support.inspector_scenario import CHART_HEIGHT, CHART_WIDTH, png
from support.inspector_server import Served, serving

TOKEN = 'a-token-the-browser-is-given-once'
T0 = (utc_now() - timedelta(hours=1)).replace(microsecond=0)
PDF = b'%PDF-1.4 a report on latency'
LONG = '\n'.join(f'line {number} of the summary' for number in range(40))
PAGES = (
    '',
    'run?id=done-run',
    'run?id=running-run',
    'run/messages?id=done-run&seq=1',
    'conversations',
    'conversation?id=c1',
)


def _usage(tokens_in: int, tokens_out: int) -> TokenUsage:
    return TokenUsage(input_tokens=tokens_in, output_tokens=tokens_out, cache_read_tokens=0, cache_write_tokens=0)


def _messages() -> list[ModelMessage]:
    return [
        ModelRequest(
            parts=[
                SystemPromptPart('You are terse.'),
                UserPromptPart(
                    [
                        'summarise the attached report',
                        BinaryContent(PDF, media_type='application/pdf'),
                        BinaryContent(png(), media_type='image/png'),
                    ]
                ),
            ]
        ),
        ModelResponse(
            parts=[
                ThinkingPart('the report is about latency'),
                TextPart('looking it up'),
                ToolCallPart('lookup', {'q': 'latency'}, 'call-1'),
            ],
            model_name='m-1',
            usage=RequestUsage(input_tokens=11, output_tokens=7),
        ),
        ModelRequest(
            parts=[
                ToolReturnPart('lookup', 'found: p99 is 120 ms', 'call-1'),
                ToolReturnPart('lookup', 'give a number', 'call-0', outcome='retried'),
            ]
        ),
        ModelResponse(parts=[TextPart(LONG)], model_name='m-2', usage=RequestUsage(input_tokens=5, output_tokens=3)),
    ]


async def _fill(store: StepStore) -> None:
    """A completed run with known times (requests of 1.5 s and 2 s, a call of 250 ms, 10 s in all), a failed,
    a crashed and a running one."""

    def at(seconds: float) -> datetime:
        return T0 + timedelta(seconds=seconds)

    await store.register_run(RunRecord(run_id='done-run', agent_name='analyst', conversation_id='c1', started_at=T0))
    done = [
        ('run_started', 0, 0.0, {}),
        ('model_request_started', 1, 1.0, {}),
        ('model_request_completed', 1, 2.5, {'model_name': 'm-1', 'usage': _usage(11, 7)}),
        ('tool_call_started', 1, 3.0, {'tool_call_id': 'call-1', 'tool_name': 'lookup'}),
        ('tool_call_completed', 1, 3.25, {'tool_call_id': 'call-1', 'tool_name': 'lookup'}),
        ('model_request_started', 2, 4.0, {}),
        ('model_request_completed', 2, 6.0, {'model_name': 'm-2', 'usage': _usage(5, 3)}),
        ('run_completed', 2, 10.0, {}),
    ]
    effect = ToolEffectRecord(
        run_id='done-run',
        tool_call_id='call-1',
        tool_name='lookup',
        status='completed',
        started_at=T0 + timedelta(seconds=3),
        ended_at=T0 + timedelta(seconds=3.25),
    )
    await write_steps(
        store,
        StepWrites(
            tool_effects=[effect],
            events=[
                StepEvent(run_id='done-run', kind=kind, step_index=step, timestamp=at(seconds), **fields)  # type: ignore[arg-type]
                for kind, step, seconds, fields in done
            ],
            snapshots=[ContinuableSnapshot(run_id='done-run', step_index=2, messages=_messages())],
        ),
    )
    await store.register_run(RunRecord(run_id='failed-run', agent_name='analyst', conversation_id='c1'))
    await store.append_event(StepEvent(run_id='failed-run', kind='run_started', step_index=0))
    await store.append_event(StepEvent(run_id='failed-run', kind='run_failed', step_index=1, error='boom'))
    await store.register_run(RunRecord(run_id='crashed-run', agent_name='worker', conversation_id='c2'))
    await store.append_event(StepEvent(run_id='crashed-run', kind='run_started', step_index=0))
    await store.append_event(
        StepEvent(run_id='crashed-run', kind='tool_call_started', step_index=1, tool_call_id='t', tool_name='charge')
    )
    await store.record_tool_effect(
        ToolEffectRecord(run_id='crashed-run', tool_call_id='t', tool_name='charge', status='started')
    )
    await store.register_run(RunRecord(run_id='running-run', agent_name='worker'))
    await store.append_event(StepEvent(run_id='running-run', kind='run_started', step_index=0))


@pytest.fixture(scope='module')
def database(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp('inspector-details') / 'runs.db'


@pytest.fixture(scope='module')
def shown(database: Path) -> Iterator[Served[None]]:
    """The records above in a SQLite store that keeps every blob in its media store, served."""
    with serving(
        lambda: SqliteStepStore(database, media_threshold_bytes=1), _fill, store_url=f'sqlite:///{database}'
    ) as served:
        yield served


@pytest.fixture(scope='module')
def guarded() -> Iterator[Served[None]]:
    """The same records in a memory store, served with a token."""
    with serving(InMemoryStepStore, _fill, token=TOKEN) as served:
        yield served


def test_each_run_row_shows_its_status_agent_times_counts_and_tokens(page: Page, shown: Served[None]) -> None:
    page.goto(shown.url)
    for run_id, status in (
        ('done-run', 'completed'),
        ('failed-run', 'failed'),
        ('crashed-run', 'crashed'),
        ('running-run', 'running'),
    ):
        expect(page.locator(f'tr.run-row[data-run-id="{run_id}"] .badge')).to_have_text(status)
    done = page.locator('tr.run-row[data-run-id="done-run"] td')
    expect(done).to_have_text(
        ['completed', 'done-run', 'analyst', 'c1', when(T0), '10.0 s', '2', '2', '1', '16 / 10', '0']
    )
    crashed = page.locator('tr.run-row[data-run-id="crashed-run"] td')
    expect(crashed.last).to_have_text('1')
    expect(crashed.last).to_have_class('number unresolved-count')


def test_the_run_list_filters_by_conversation(page: Page, shown: Served[None]) -> None:
    page.goto(shown.url)
    page.fill('input[name=conversation]', 'c1')
    page.locator('form.filters button').click()
    expect(page.locator('tr.run-row')).to_have_count(2)
    ids = page.locator('tr.run-row').evaluate_all('rows => rows.map(row => row.dataset.runId)')
    assert ids == ['failed-run', 'done-run']
    page.locator('tr.run-row[data-run-id="done-run"] a.conversation-id').click()
    expect(page.locator('ul.conversation-tree a.run-id')).to_have_text(['done-run', 'failed-run'])


def test_the_timeline_shows_durations_models_tokens_arguments_results_and_ledger_statuses(
    page: Page, shown: Served[None]
) -> None:
    page.goto(shown.url + 'run?id=done-run')
    requests = page.locator('li.entry-model')
    expect(requests.locator('.duration')).to_have_text(['1.5 s', '2.0 s'])
    expect(requests.locator('.model')).to_have_text(['m-1', 'm-2'])
    expect(requests.locator('.tokens')).to_have_text(['11 in / 7 out tokens', '5 in / 3 out tokens'])
    call = page.locator('li.entry-tool')
    expect(call.locator('.duration')).to_have_text('250 ms')
    expect(call.locator('.ledger-status')).to_have_text('ledger: completed')
    expect(call.locator('.result code')).to_have_text('found: p99 is 120 ms')
    arguments = call.locator('details.arguments')
    expect(arguments.locator('pre')).to_be_hidden()
    arguments.locator('summary').click()
    expect(arguments.locator('pre')).to_contain_text('latency')


def test_a_snapshots_continue_and_fork_lines_are_copied(
    page: Page, context: BrowserContext, shown: Served[None]
) -> None:
    context.grant_permissions(['clipboard-read', 'clipboard-write'], origin=shown.url.rstrip('/'))
    page.goto(shown.url + 'run?id=done-run')
    for kind, helper in (('continue', 'continue_run'), ('fork', 'fork_run')):
        line = page.locator(f'code#{kind}-1')
        expect(line).to_have_text(f"messages = await {helper}(store, run_id='done-run', seq=1)")
        button = page.locator(f'button[data-copy="{kind}-1"]')
        button.click()
        expect(button).to_have_text('Copied')
        assert page.evaluate('navigator.clipboard.readText()') == line.text_content()


def test_every_kind_of_part_is_shown_long_ones_collapsed_media_inline_or_linked(
    page: Page, shown: Served[None], database: Path
) -> None:
    with sqlite3.connect(database) as connection:
        stored = {digest for (digest,) in connection.execute('SELECT digest FROM media')}
    assert {blob_digest(png()), blob_digest(PDF)} <= stored, 'the image and the PDF are in the media store'
    page.goto(shown.url + 'run/messages?id=done-run&seq=1')
    for kind, text in (
        ('system-prompt', 'You are terse.'),
        ('user-prompt', 'summarise the attached report'),
        ('thinking', 'the report is about latency'),
        ('text', 'looking it up'),
        ('tool-call', 'latency'),
        ('tool-return', 'found: p99 is 120 ms'),
    ):
        expect(page.locator(f'section.part-{kind}').first).to_contain_text(text)
    retry = page.locator('section.part-tool-return.part-retry')
    expect(retry.locator('.part-title')).to_have_text('retry')
    expect(retry.locator('.outcome')).to_have_text('retried')
    expect(retry.locator('pre')).to_have_text('give a number')
    image = page.locator('section.part-user-prompt figure.media-inline img')
    expect(image).to_be_visible()
    page.wait_for_function('img => img.complete', arg=image.element_handle())
    assert image.evaluate('img => [img.naturalWidth, img.naturalHeight]') == [CHART_WIDTH, CHART_HEIGHT]
    link = page.locator('section.part-user-prompt p.media-link a')
    expect(link).to_have_text(f'application/pdf, {len(PDF)} bytes')
    download = page.request.get(shown.url.rstrip('/') + (link.get_attribute('href') or ''))
    assert download.body() == PDF and download.headers['content-type'] == 'application/pdf'
    assert download.headers['content-disposition'].startswith('attachment')
    long = page.locator('section.part-text details.long')
    expect(long.locator('summary')).to_contain_text(f'({len(LONG)} characters)')
    expect(long.locator('pre')).to_be_hidden()
    long.locator('summary').click()
    expect(long.locator('pre')).to_have_text(LONG)


def test_no_page_breaks_the_content_security_policy_which_the_browser_enforces(page: Page, shown: Served[None]) -> None:
    problems: list[str] = []

    def console(message: ConsoleMessage) -> None:
        if message.type == 'error':
            problems.append(message.text)

    def crashed(error: Error) -> None:
        problems.append(error.message)

    page.on('console', console)
    page.on('pageerror', crashed)
    for address in PAGES:
        page.goto(shown.url + address)
        page.wait_for_load_state('load')
        expect(page.locator('main')).to_be_visible()
        assert page.evaluate('document.styleSheets.length') == 1, 'the stylesheet was let in'
    page.goto(shown.url + 'run?id=running-run')
    expect(page.locator('main[data-state-url]')).to_be_visible()
    page.wait_for_load_state('networkidle')
    assert problems == []
    violated = page.evaluate(
        """() => new Promise(resolve => {
            document.addEventListener('securitypolicyviolation', e => resolve(e.effectiveDirective), {once: true});
            const script = document.createElement('script');
            script.textContent = 'window.__inline = 1';
            document.head.appendChild(script);
        })"""
    )
    assert violated == 'script-src-elem' or violated.startswith('script-src')
    assert page.evaluate('window.__inline') is None


def test_the_token_is_taken_once_then_a_cookie_scripts_cannot_read_carries_the_visit(
    page: Page, context: BrowserContext, browser: Browser, guarded: Served[None]
) -> None:
    page.goto(guarded.url + f'?token={TOKEN}')
    expect(page.locator('tr.run-row[data-run-id="done-run"]')).to_be_visible()
    assert page.url == guarded.url, 'the token left the address bar'
    page.locator('tr.run-row[data-run-id="done-run"] a.run-id').click()
    expect(page.locator('h1 .run-id')).to_have_text('done-run')
    [cookie] = context.cookies()
    assert cookie['httpOnly'] and cookie.get('sameSite') == 'Strict' and TOKEN not in cookie['value']
    assert page.evaluate('document.cookie') == ''
    stranger = browser.new_context()
    try:
        refused = stranger.new_page().goto(guarded.url + 'run?id=done-run')
        assert refused is not None and refused.status == 401
    finally:
        stranger.close()
