"""The store the inspector's tests (and `make screenshots`) look at, written by scripted agents.

Oldest first:

- `FILLER_RUNS` runs of the `filler` agent, a day old: one scripted run and copies of its records
  under other ids (running 500 agents would cost seconds for nothing the list shows differently);
- an orchestrator (`orchestrator-run`, conversation `conv-research`) that delegates to a
  researcher, and a run continuing it and one forking it;
- `image-run`, whose tool returns a PNG (a tool return with binary content);
- `xss-run`, whose tool returns (and annotates its ledger record with) `XSS`;
- `mailer-run`, which fails: a lookup asked to retry, then a tool that raises;
- with `crash_spec`, a worker that crashes mid-tool in another process (`support/child.py crash`),
  leaving its `charge_card` call unresolved with idempotency key `charge-order-7`;
- `held-run`, still running: its tool waits until `Scenario.release()`.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import struct
import zlib
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import anyio.to_thread
import pytest
from pydantic_ai import Agent, ModelRetry, RunContext
from pydantic_ai.messages import BinaryContent

from step_persistence import (
    RunRecord,
    StepPersistence,
    StepStore,
    annotate_tool_effect,
    continue_run,
    fork_run,
)
from step_persistence.protocol import write_steps
from step_persistence.records import StepWrites, utc_now
from support.console_script import python_script
from support.scripted import calls, scripted, text

__all__ = [
    'CHART_HEIGHT',
    'CHART_WIDTH',
    'FILLER_AGENT',
    'FILLER_RUNS',
    'XSS',
    'Scenario',
    'png',
    'scenario_pages',
    'write_scenario',
]

CHILD = Path(__file__).with_name('child.py')
FILLER_AGENT = 'filler'
FILLER_RUNS = 500
XSS = '<script>window.__xss = 1; alert("xss")</script><img src=x onerror="window.__xss = 2">'
"""What a scraped page could hold: if the inspector ever obeyed it, a dialog would open or `window.__xss` be set."""


CHART_WIDTH, CHART_HEIGHT = 160, 80


def png(width: int = CHART_WIDTH, height: int = CHART_HEIGHT) -> bytes:
    """A real PNG image (a small bar chart), built by hand so that no image library is needed."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack('>I', len(data)) + kind + data + struct.pack('>I', zlib.crc32(kind + data))

    bars = [0.35, 0.6, 0.45, 0.8, 0.55, 0.9, 0.7, 0.4]
    bar_width = width // len(bars)

    def pixel(x: int, y: int) -> bytes:
        bar = bars[min(x // bar_width, len(bars) - 1)]
        inside = x % bar_width >= 3 and height - y <= bar * height
        return b'\x2f\x5b\xd3' if inside else b'\xf5\xf6\xf9'

    rows = b''.join(b'\x00' + b''.join(pixel(x, y) for x in range(width)) for y in range(height))
    header = struct.pack('>IIBBBBB', width, height, 8, 2, 0, 0, 0)
    return b'\x89PNG\r\n\x1a\n' + chunk(b'IHDR', header) + chunk(b'IDAT', zlib.compress(rows)) + chunk(b'IEND', b'')


@dataclass
class Scenario:
    """The ids of the runs written, and the hand that lets the held run finish."""

    fillers: list[str]
    crashed_run: str | None
    held: asyncio.Event
    held_task: asyncio.Task[Any]

    def release(self) -> None:
        """Let `held-run` finish (call it on the store's event loop)."""
        self.held.set()


async def _fillers(store: StepStore, count: int) -> list[str]:
    agent = Agent(scripted(text('filled')), capabilities=[StepPersistence(store=store, agent_name=FILLER_AGENT)])
    await agent.run('fill')
    [template] = await store.list_runs(agent_name=FILLER_AGENT)
    events = await store.list_events(run_id=template.run_id)
    start = utc_now() - timedelta(days=1)
    ids = [template.run_id]
    for number in range(1, count):
        run_id = f'filler-{number:03d}'
        moment = start + timedelta(seconds=number)
        await store.register_run(RunRecord(run_id=run_id, agent_name=FILLER_AGENT, started_at=moment))
        copies = [event.model_copy(update={'run_id': run_id, 'timestamp': moment}) for event in events]
        await write_steps(store, StepWrites(events=copies))
        ids.append(run_id)
    return ids


async def _delegation(store: StepStore) -> None:
    researcher = Agent(
        scripted(calls(('search', {'query': 'durable agents'}, 'search-1')), text('three papers found')),
        capabilities=[StepPersistence(store=store, agent_name='researcher', run_id='researcher-run')],
    )

    @researcher.tool_plain
    async def search(query: str) -> str:
        return f'results for {query}: 3 papers'

    orchestrator = Agent(
        scripted(
            calls(('plan', {'goal': 'a survey'}, 'plan-1'), ('ask_researcher', {'topic': 'durability'}, 'ask-1')),
            text('the survey is planned'),
        ),
        capabilities=[StepPersistence(store=store, agent_name='orchestrator', run_id='orchestrator-run')],
    )

    @orchestrator.tool_plain
    async def plan(goal: str) -> str:
        return f'plan for {goal}: outline, sources, draft'

    @orchestrator.tool_plain
    async def ask_researcher(topic: str) -> str:
        return (await researcher.run(topic)).output

    await orchestrator.run('plan a survey of durable agents', conversation_id='conv-research')
    for run_id, helper in (('follow-up-run', continue_run), ('fork-run', fork_run)):
        history = await helper(store, run_id='orchestrator-run')
        follower = Agent(
            scripted(text(f'{run_id}: picked up where the plan ended')),
            capabilities=[StepPersistence(store=store, agent_name='orchestrator', run_id=run_id)],
        )
        await follower.run('now write the outline', message_history=history, conversation_id='conv-research')


async def _image(store: StepStore) -> None:
    agent = Agent(
        scripted(calls(('render_chart', {'metric': 'latency'}, 'chart-1')), text('here is the chart')),
        capabilities=[StepPersistence(store=store, agent_name='charts', run_id='image-run')],
    )

    @agent.tool_plain
    async def render_chart(metric: str) -> BinaryContent:
        return BinaryContent(png(), media_type='image/png')

    await agent.run('chart the latency', conversation_id='conv-charts')


async def _xss(store: StepStore) -> None:
    agent = Agent(
        scripted(calls(('fetch_page', {'url': 'https://example.invalid/'}, 'fetch-1')), text('fetched')),
        capabilities=[StepPersistence(store=store, agent_name='scraper', run_id='xss-run')],
    )

    @agent.tool
    async def fetch_page(ctx: RunContext[None], url: str) -> str:
        await annotate_tool_effect(store, ctx, effect_summary=XSS)
        return XSS

    await agent.run('fetch the page')


async def _failing(store: StepStore) -> None:
    agent = Agent(
        scripted(
            calls(('lookup', {'name': 'ada'}, 'lookup-1')),
            calls(('lookup', {'name': 'ada lovelace'}, 'lookup-2')),
            calls(('send_mail', {'to': 'ada@example.com'}, 'mail-1')),
            text('unreachable'),
        ),
        capabilities=[StepPersistence(store=store, agent_name='mailer', run_id='mailer-run')],
    )

    @agent.tool_plain
    async def lookup(name: str) -> str:
        if ' ' not in name:
            raise ModelRetry('give the full name')
        return f'{name} <ada@example.com>'

    @agent.tool_plain
    async def send_mail(to: str) -> str:
        raise RuntimeError(f'SMTP refused {to}')

    with pytest.raises(RuntimeError, match='SMTP refused'):
        await agent.run('mail ada')


async def _crash(store: StepStore, spec: dict[str, Any]) -> str:
    completed = await anyio.to_thread.run_sync(python_script, CHILD, 'crash', json.dumps(spec))
    assert completed.returncode == 17, completed.stderr
    [crashed] = await store.list_runs(agent_name='worker')
    return crashed.run_id


async def _held(store: StepStore) -> tuple[asyncio.Event, asyncio.Task[Any]]:
    release, entered = asyncio.Event(), asyncio.Event()
    agent = Agent(
        scripted(calls(('wait_for_approval', {'request': 'deploy'}, 'approval-1')), text('approved and deployed')),
        capabilities=[StepPersistence(store=store, agent_name='deployer', run_id='held-run')],
    )

    @agent.tool_plain
    async def wait_for_approval(request: str) -> str:
        entered.set()
        await release.wait()
        return f'{request} approved'

    task = asyncio.create_task(agent.run('deploy when approved'))
    await entered.wait()
    return release, task


async def write_scenario(
    store: StepStore, *, crash_spec: dict[str, Any] | None, fillers: int = FILLER_RUNS
) -> Scenario:
    """Write the runs above into `store`; `crash_spec` is how another process opens it (`None`: no crash)."""
    filler_ids = await _fillers(store, fillers)
    await _delegation(store)
    await _image(store)
    await _xss(store)
    await _failing(store)
    crashed = None if crash_spec is None else await _crash(store, crash_spec)
    held, task = await _held(store)
    return Scenario(fillers=filler_ids, crashed_run=crashed, held=held, held_task=task)


async def scenario_pages(store: StepStore) -> list[str]:
    """The address of every page of the inspector over the scenario, with each filter of the run list."""
    snapshots = await store.list_snapshots(run_id='image-run', include_interrupted=True)
    seq = snapshots[-1].seq
    return [
        '/',
        '/?start=3&size=5',
        f'/?agent={FILLER_AGENT}',
        '/?conversation=conv-research',
        '/?status=crashed',
        '/?q=fork',
        '/run?id=orchestrator-run',
        '/run?id=researcher-run',
        '/run?id=fork-run',
        '/run?id=mailer-run',
        '/run?id=held-run',
        '/run/state?id=held-run',
        f'/run/messages?id=image-run&seq={seq}',
        f'/media?run=image-run&seq={seq}&digest={hashlib.sha256(png()).hexdigest()}',
        '/conversations',
        '/conversation?id=conv-research',
    ]
