"""The inspector in a real browser (headless Chromium through Playwright), on a store scripted agents wrote.

Each test opens pages of the scenario (support/inspector_scenario.py) served on one backend
(SQLite, the file store, memory) and checks what a person would see; none changes the store but
the live-refresh test, which lets the held run finish last.
"""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import Dialog, Page, expect

from step_persistence.records import StepEvent
from support.inspector_scenario import CHART_HEIGHT, CHART_WIDTH, FILLER_AGENT, FILLER_RUNS, XSS, Scenario
from support.inspector_server import Served

PAGE = 100
"""The page size the pagination test asks for (`?size=`): five pages of the 500 runs."""


def test_the_run_list_shows_the_runs_newest_first_with_their_status(page: Page, site: Served[Scenario]) -> None:
    page.goto(site.url)
    rows = page.locator('tr.run-row')
    expect(rows.first).to_have_attribute('data-run-id', 'held-run')
    for run_id, status in (
        ('orchestrator-run', 'completed'),
        ('researcher-run', 'completed'),
        ('mailer-run', 'failed'),
        ('image-run', 'completed'),
    ):
        row = page.locator(f'tr.run-row[data-run-id="{run_id}"]')
        expect(row.locator('.badge')).to_have_text(status)
    records = site.call(lambda: site.store.list_runs(newest_first=True, limit=50))
    assert rows.evaluate_all('rows => rows.map(row => row.dataset.runId)') == [r.run_id for r in records]


def test_a_crashed_run_shows_its_unresolved_effect_first_and_highlighted(page: Page, site: Served[Scenario]) -> None:
    crashed = site.facts.crashed_run
    if crashed is None:
        pytest.skip('a crash needs another process on the same store; the memory store has none')
    page.goto(site.url + f'?q={crashed}')
    page.locator(f'tr.run-row[data-run-id="{crashed}"] a.run-id').click()
    expect(page.locator('h1 .badge')).to_have_text('crashed')
    card = page.locator('article.effect').first
    expect(card).to_have_class(re.compile(r'\bunresolved\b'))
    expect(card.locator('h3')).to_contain_text('charge_card')
    expect(card.locator('.idempotency-key')).to_have_text('charge-order-7')
    expect(card.locator('.summary')).to_have_text('charge 500')
    expect(page.locator('p.warning')).to_contain_text('1 unresolved')
    page.wait_for_load_state('load')  # computed styles are only final once the stylesheet has loaded
    highlighted = card.evaluate('card => getComputedStyle(card).backgroundColor')
    settled = page.locator('article.effect:not(.unresolved)').first.evaluate('c => getComputedStyle(c).backgroundColor')
    assert highlighted != settled, 'the unresolved card stands out'
    expect(page.locator('li.entry-tool.outcome-in-flight .ledger-status')).to_have_text('ledger: unresolved')


def test_the_timeline_follows_the_event_log(page: Page, site: Served[Scenario]) -> None:
    events: list[StepEvent] = site.call(lambda: site.store.list_events(run_id='mailer-run'))
    page.goto(site.url + 'run?id=mailer-run')
    entries = page.locator('ol.timeline > li.entry')
    expect(entries.first).to_be_visible()
    shown = entries.evaluate_all(
        'items => items.map(item => [Number(item.dataset.firstEvent), item.dataset.events.split(" ")])'
    )
    firsts = [first for first, _ in shown]
    assert firsts == sorted(firsts), 'entries in the order their first event was appended'
    assert sorted(index for first, kinds in shown for index in _positions(first, kinds, events)) == list(
        range(len(events))
    ), 'every event appears once'
    for first, kinds in shown:
        assert events[first].kind == kinds[0]
    failure = page.locator('li.entry-run.outcome-failed')
    expect(failure.locator('.error-text')).to_contain_text('SMTP refused ada@example.com')
    failure.locator('a.failed-at').click()
    expect(page.locator('li.entry:target .title')).to_have_text('tool call send_mail')
    retried = page.locator('li.entry-tool', has=page.locator('.call-id', has_text='lookup-1'))
    expect(retried.locator('.result')).to_contain_text('give the full name')


def _positions(first: int, kinds: list[str], events: list[StepEvent]) -> list[int]:
    """Where each of an entry's events is in the log: its first, then the next of the same call (or request)."""
    found = [first]
    for kind in kinds[1:]:
        call = events[first].tool_call_id
        found.append(
            next(
                index
                for index in range(found[-1] + 1, len(events))
                if events[index].kind == kind and events[index].tool_call_id == call
            )
        )
    return found


def test_an_image_returned_by_a_tool_renders(page: Page, site: Served[Scenario]) -> None:
    page.goto(site.url + 'run?id=image-run')
    page.locator('tr.snapshot').last.locator('a').first.click()
    image = page.locator('section.part-tool-return figure.media-inline img')
    expect(image).to_be_visible()
    page.wait_for_function('img => img.complete', arg=image.element_handle())
    assert image.evaluate('img => img.naturalWidth') == CHART_WIDTH
    assert image.evaluate('img => img.naturalHeight') == CHART_HEIGHT
    response = page.request.get(site.url.rstrip('/') + (image.get_attribute('src') or ''))
    assert response.headers['content-type'] == 'image/png'
    assert response.headers['x-content-type-options'] == 'nosniff'


def test_a_script_in_a_tool_result_stays_text(page: Page, site: Served[Scenario]) -> None:
    dialogs: list[str] = []

    def record(dialog: Dialog) -> None:
        dialogs.append(dialog.message)
        dialog.dismiss()

    page.on('dialog', record)
    page.goto(site.url + 'run?id=xss-run')
    expect(page.locator('li.entry-tool .result code')).to_have_text(XSS)
    expect(page.locator('article.effect .summary')).to_have_text(XSS)
    page.locator('tr.snapshot').last.locator('a').first.click()
    expect(page.locator('section.part-tool-return pre')).to_have_text(XSS)
    assert page.evaluate('window.__xss') is None
    assert page.locator('main script, main img[src="x"]').count() == 0
    assert dialogs == []


def test_pagination_walks_every_run_of_500(page: Page, site: Served[Scenario]) -> None:
    expected = [r.run_id for r in site.call(lambda: site.store.list_runs(agent_name=FILLER_AGENT, newest_first=True))]
    assert len(expected) == FILLER_RUNS
    page.goto(site.url + f'?agent={FILLER_AGENT}&size={PAGE}')
    seen: list[str] = []
    while True:
        rows = page.locator('tr.run-row')
        expect(rows.first).to_be_visible()
        seen.extend(rows.evaluate_all('rows => rows.map(row => row.dataset.runId)'))
        older = page.locator('nav.pages a.older')
        if older.count() == 0:
            break
        older.click()
    assert seen == expected
    expect(page.locator('nav.pages .position')).to_contain_text(f'Runs {FILLER_RUNS - PAGE + 1} to {FILLER_RUNS}')
    page.locator('nav.pages a.newer').click()
    expect(page.locator('tr.run-row').first).to_have_attribute('data-run-id', expected[-2 * PAGE])


def test_the_run_list_filters_by_status_and_run_id_text(page: Page, site: Served[Scenario]) -> None:
    page.goto(site.url)
    page.select_option('select[name=status]', 'failed')
    page.locator('form.filters button').click()
    expect(page.locator('tr.run-row')).to_have_count(1)
    expect(page.locator('tr.run-row')).to_have_attribute('data-run-id', 'mailer-run')
    page.goto(site.url + '?q=RUN&agent=orchestrator')
    ids = page.locator('tr.run-row').evaluate_all('rows => rows.map(row => row.dataset.runId)')
    assert ids == ['fork-run', 'follow-up-run', 'orchestrator-run']


def test_lineage_and_conversations_are_navigable(page: Page, site: Served[Scenario]) -> None:
    page.goto(site.url + 'run?id=researcher-run')
    page.locator('li.ancestor a.run-id').click()
    expect(page.locator('h1 .run-id')).to_have_text('orchestrator-run')
    expect(page.locator('li.delegate a.run-id')).to_have_text('researcher-run')
    expect(page.locator('li.continuation .relation')).to_have_text(['continued by', 'forked by'])
    page.locator('li.continuation a.run-id', has_text='fork-run').click()
    expect(page.locator('.origin')).to_contain_text('forked from orchestrator-run')
    page.locator('dd a.conversation-id').click()
    tree = page.locator('ul.conversation-tree')
    expect(tree.locator(':scope > li > a.run-id')).to_have_text('orchestrator-run')
    expect(tree.locator('li li a.run-id')).to_have_text(['follow-up-run', 'fork-run'])
    page.locator('header nav a', has_text='Conversations').click()
    expect(page.locator('tr.conversation-row a.conversation-id').first).to_be_visible()


def test_a_running_run_refreshes_without_a_reload(page: Page, site: Served[Scenario]) -> None:
    """Last in the module: it lets the held run finish."""
    page.goto(site.url + 'run?id=held-run')
    expect(page.locator('h1 .badge')).to_have_text('crashed')  # its tool is in flight: a reader must assume the worst
    page.evaluate('window.__not_reloaded = true')
    site.loop.call_soon_threadsafe(site.facts.release)
    expect(page.locator('h1 .badge')).to_have_text('completed')
    expect(page.locator('li.entry-run.outcome-completed')).to_have_count(1)
    assert page.evaluate('window.__not_reloaded') is True
