"""The record's identity on the OpenTelemetry spans of pydantic-ai's instrumentation (docs/observability.md).

One scenario per backend: an instrumented orchestrator delegates to an instrumented child, a tool
annotates its effect with an idempotency key, and a second run continues the first. Every run,
model request and tool span then carries what the store recorded for it. Without instrumentation
(even inside an application's span) and with `span_attributes=False`, the spans are what
pydantic-ai alone makes.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from pydantic_ai import Agent, RunContext
from pydantic_ai.capabilities import Instrumentation
from pydantic_ai.models.instrumented import InstrumentationSettings

from step_persistence import InMemoryStepStore, StepPersistence, StepStore, annotate_tool_effect, continue_run
from step_persistence._telemetry import (
    CONVERSATION_ID,
    ORIGIN_KIND,
    ORIGIN_RUN_ID,
    ORIGIN_SEQ,
    PARENT_RUN_ID,
    RUN_ID,
    SNAPSHOT_SEQ,
    SNAPSHOT_STATE,
    STEP_INDEX,
    TOOL_EFFECT_IDEMPOTENCY_KEY,
    TOOL_EFFECT_STATUS,
)
from support.backends import StoreMaker
from support.scripted import calls, scripted, text

pytestmark = pytest.mark.anyio

NAMESPACE = 'step_persistence.'
OBSERVABILITY = Path(__file__).resolve().parents[2] / 'docs' / 'observability.md'


class Traces:
    """A tracer provider whose finished spans the test reads back."""

    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.provider = TracerProvider()
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))

    def settings(self) -> InstrumentationSettings:
        return InstrumentationSettings(tracer_provider=self.provider)

    def spans(self, operation: str | None = None) -> list[ReadableSpan]:
        spans = list(self.exporter.get_finished_spans())
        if operation is None:
            return spans
        return [span for span in spans if attributes(span).get('gen_ai.operation.name') == operation]


def attributes(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


def ours(span: ReadableSpan) -> dict[str, Any]:
    return {name: value for name, value in attributes(span).items() if name.startswith(NAMESPACE)}


def agents(store: StepStore, traces: Traces | None, **options: Any) -> Agent[None, str]:
    """An orchestrator asking a librarian (a delegated run), then setting a label with an idempotency key."""
    persistence = StepPersistence[None](store=store, **options)
    librarian = Agent(
        scripted(text('the answer')),
        name='librarian',
        capabilities=[StepPersistence[None](store=store, **options)]
        + ([] if traces is None else [Instrumentation(settings=traces.settings())]),
    )
    orchestrator = Agent(
        scripted(calls(('ask', {'question': 'q'})), calls(('label', {'name': 'bug'})), text('done')),
        name='orchestrator',
        capabilities=[persistence],
    )
    if traces is not None:
        orchestrator.instrument = traces.settings()

    @orchestrator.tool_plain
    async def ask(question: str) -> str:
        return (await librarian.run(question)).output

    @orchestrator.tool
    async def label(ctx: RunContext[None], name: str) -> str:
        await annotate_tool_effect(store, ctx, idempotency_key=f'label:{name}')
        return 'labelled'

    return orchestrator


async def run_and_continue(orchestrator: Agent[None, str], store: StepStore, conversation_id: str = 'conv-1') -> None:
    await orchestrator.run('first', conversation_id=conversation_id)
    [first] = await store.list_runs(conversation_id=conversation_id)
    history = await continue_run(store, run_id=first.run_id)
    await orchestrator.run('again', message_history=history, conversation_id=conversation_id)


def documented_attributes() -> set[str]:
    """The attribute names docs/observability.md's table lists."""
    return set(re.findall(r'^\| `(step_persistence\.[a-z_.]+)` \|', OBSERVABILITY.read_text(), re.MULTILINE))


def by_run(spans: Sequence[ReadableSpan]) -> dict[str, list[ReadableSpan]]:
    grouped: dict[str, list[ReadableSpan]] = {}
    for span in spans:
        grouped.setdefault(attributes(span)[RUN_ID], []).append(span)
    return grouped


async def test_the_record_is_on_the_run_model_request_and_tool_spans(make_store: StoreMaker) -> None:
    store, traces = await make_store(), Traces()
    await run_and_continue(agents(store, traces), store)

    records = await store.list_runs()
    assert len(records) == 4, 'two orchestrator runs, each delegating one librarian run'
    run_spans, chat_spans, tool_spans = (
        by_run(traces.spans(kind)) for kind in ('invoke_agent', 'chat', 'execute_tool')
    )
    assert set(run_spans) == set(chat_spans) == {record.run_id for record in records}
    for record in records:
        [run_span] = run_spans[record.run_id]
        lineage = {
            CONVERSATION_ID: record.conversation_id,
            PARENT_RUN_ID: record.parent_run_id,
            ORIGIN_KIND: None if record.origin is None else record.origin.kind,
            ORIGIN_RUN_ID: None if record.origin is None else record.origin.run_id,
            ORIGIN_SEQ: None if record.origin is None else record.origin.seq,
        }
        assert {name: ours(run_span).get(name) for name in lineage} == lineage

        events = await store.list_events(run_id=record.run_id)
        requests = chat_spans[record.run_id]
        assert sorted(attributes(span)[STEP_INDEX] for span in requests) == [
            event.step_index for event in events if event.kind == 'model_request_started'
        ]
        # Each snapshot is on the span current when it was written: a tool cycle's on the next model
        # request's span, the final one on the run's span.
        on_spans = sorted(
            (ours(span)[SNAPSHOT_SEQ], ours(span)[SNAPSHOT_STATE])
            for span in [*requests, run_span]
            if SNAPSHOT_SEQ in ours(span)
        )
        stored = await store.list_snapshots(run_id=record.run_id, include_interrupted=True)
        assert on_spans == [(snapshot.seq, snapshot.state) for snapshot in stored]
        assert len(stored) == (1 if record.agent_name == 'librarian' else 3)

        effects = await store.list_tool_effects(run_id=record.run_id)
        calls_by_id = {attributes(span)['gen_ai.tool.call.id']: span for span in tool_spans.get(record.run_id, [])}
        assert set(calls_by_id) == {effect.tool_call_id for effect in effects}
        for effect in effects:
            on_span = ours(calls_by_id[effect.tool_call_id])
            assert on_span[TOOL_EFFECT_STATUS] == effect.status == 'completed'
            assert on_span.get(TOOL_EFFECT_IDEMPOTENCY_KEY) == effect.idempotency_key
    [first, continued] = [record for record in records if record.agent_name == 'orchestrator']
    assert continued.origin is not None
    assert (continued.origin.kind, continued.origin.run_id) == ('continued', first.run_id)
    assert {effect.idempotency_key for effect in await store.list_tool_effects(run_id=first.run_id)} == {
        None,
        'label:bug',
    }
    [child_of_first] = [record for record in records if record.parent_run_id == first.run_id]
    assert child_of_first.agent_name == 'librarian'

    assert set().union(*(ours(span) for span in traces.spans())) == documented_attributes()

    # An uninstrumented run inside the application's own span leaves that span alone.
    traces.exporter.clear()
    with traces.provider.get_tracer('application').start_as_current_span('request'):
        await agents(store, None).run('uninstrumented', conversation_id='conv-2')
    [application_span] = traces.spans()
    assert ours(application_span) == {}
    assert len(await store.list_runs(conversation_id='conv-2')) == 1


async def test_with_span_attributes_off_the_spans_are_pydantic_ais_own(make_store: StoreMaker) -> None:
    store = await make_store()
    with_attributes, without = Traces(), Traces()
    await run_and_continue(agents(store, with_attributes), store, 'on')
    await run_and_continue(agents(store, without, span_attributes=False), store, 'off')

    def names(spans: Sequence[ReadableSpan]) -> Counter[str]:
        return Counter(span.name for span in spans)

    assert names(without.spans()) == names(with_attributes.spans())
    assert all(ours(span) == {} for span in without.spans())
    assert all(RUN_ID in ours(span) for span in with_attributes.spans())
    assert len(await store.list_runs()) == 8, 'the record is written either way'


async def test_a_failed_call_and_the_failure_snapshot_are_on_their_spans() -> None:
    store, traces = InMemoryStepStore(), Traces()
    agent = Agent(scripted(calls(('charge', {'cents': 5}))), capabilities=[StepPersistence[None](store=store)])
    agent.instrument = traces.settings()

    @agent.tool
    async def charge(ctx: RunContext[None], cents: int) -> str:
        await annotate_tool_effect(store, ctx, idempotency_key=f'charge:{cents}')
        raise ConnectionError('the payment service hung up')

    with pytest.raises(ConnectionError):
        await agent.run('charge it')
    [record] = await store.list_runs()
    [effect] = await store.list_tool_effects(run_id=record.run_id)
    [tool_span] = traces.spans('execute_tool')
    assert (ours(tool_span)[TOOL_EFFECT_STATUS], ours(tool_span)[TOOL_EFFECT_IDEMPOTENCY_KEY]) == (
        effect.status,
        effect.idempotency_key,
    )
    assert effect.status == 'failed'
    [run_span] = traces.spans('invoke_agent')
    latest = await store.latest_snapshot(run_id=record.run_id, include_interrupted=True)
    assert latest is not None and latest.state == 'interrupted'
    assert (ours(run_span)[SNAPSHOT_SEQ], ours(run_span)[SNAPSHOT_STATE]) == (latest.seq, 'interrupted')


def test_the_documented_names_are_the_ones_set_and_stay_as_they_are() -> None:
    """docs/observability.md promises these names; renaming one breaks every dashboard built on it."""
    constants = {
        CONVERSATION_ID,
        ORIGIN_KIND,
        ORIGIN_RUN_ID,
        ORIGIN_SEQ,
        PARENT_RUN_ID,
        RUN_ID,
        SNAPSHOT_SEQ,
        SNAPSHOT_STATE,
        STEP_INDEX,
        TOOL_EFFECT_IDEMPOTENCY_KEY,
        TOOL_EFFECT_STATUS,
    }
    assert (
        documented_attributes()
        == constants
        == {
            'step_persistence.run_id',
            'step_persistence.conversation_id',
            'step_persistence.parent_run_id',
            'step_persistence.origin.kind',
            'step_persistence.origin.run_id',
            'step_persistence.origin.seq',
            'step_persistence.step_index',
            'step_persistence.snapshot.seq',
            'step_persistence.snapshot.state',
            'step_persistence.tool_effect.status',
            'step_persistence.tool_effect.idempotency_key',
        }
    )


INSTRUMENT_TRUE = """
import asyncio, json
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from pydantic_ai import Agent
from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import FunctionModel
from step_persistence import InMemoryStepStore, StepPersistence

exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(provider)  # the global provider, which instrument=True uses


def model(messages, info):
    if len(messages) == 1:
        return ModelResponse(parts=[ToolCallPart('lookup', {'key': 'a'}, 'call-1')])
    return ModelResponse(parts=[TextPart('found it')])


async def main():
    store = InMemoryStepStore()
    agent = Agent(FunctionModel(model), capabilities=[StepPersistence(store=store)])
    agent.instrument = True  # pydantic-ai 2's spelling of Agent(instrument=True)

    @agent.tool_plain
    def lookup(key: str) -> str:
        return key

    result = await agent.run('look it up', conversation_id='c')
    latest = await store.latest_snapshot(run_id=result.run_id)
    spans = []
    for span in exporter.get_finished_spans():
        ours = {name: value for name, value in span.attributes.items() if name.startswith('step_persistence.')}
        spans.append([span.attributes.get('gen_ai.operation.name'), ours])
    print(json.dumps({'run_id': result.run_id, 'seq': latest.seq, 'spans': spans}))


asyncio.run(main())
"""


def test_an_agent_instrumented_with_true_gets_the_attributes() -> None:
    """`agent.instrument = True` (the issue's `Agent(instrument=True)`: pydantic-ai 2 takes it as an attribute)
    traces to the global tracer provider, which a test process cannot set twice: the run is made in a
    process of its own."""
    completed = subprocess.run([sys.executable, '-c', INSTRUMENT_TRUE], capture_output=True, text=True, timeout=120)
    assert completed.returncode == 0, completed.stderr
    found = json.loads(completed.stdout)
    spans: dict[str, dict[str, Any]] = {operation: attributes for operation, attributes in found['spans']}
    assert set(spans) == {'invoke_agent', 'chat', 'execute_tool'}
    assert spans['invoke_agent'][RUN_ID] == found['run_id']
    assert spans['invoke_agent'][CONVERSATION_ID] == 'c'
    assert (spans['invoke_agent'][SNAPSHOT_SEQ], spans['invoke_agent'][SNAPSHOT_STATE]) == (found['seq'], 'complete')
    assert spans['execute_tool'][TOOL_EFFECT_STATUS] == 'completed'
    assert spans['chat'][RUN_ID] == found['run_id']
