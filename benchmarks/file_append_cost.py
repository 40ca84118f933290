"""How the cost of one agent step on a `FileStepStore` changes as the run grows.

By default a real agent (a scripted model, no network) calls a tool at every step, with
`StepPersistence` recording events, the tool-effect ledger and a snapshot of the whole history per
step. Each tool call samples the store's byte counters, the time spent awaiting the store, and
the clock, so the difference between two samples is the cost of one step. pydantic-ai's own work
per step grows with the history, and it shares the process with the store, so `--store-only`
makes the same store calls as the capability without an agent, to time the store alone. For
contrast, `history JSON` is what a store that rewrote the history at every snapshot would write
at that step.

    python benchmarks/file_append_cost.py [--steps 1000] [--every 250] [--no-fsync] [--store-only]

`--next-to-harness` (in the benchmark environment: `cd benchmarks && uv run python
file_append_cost.py --next-to-harness`) measures instead what `bench.py --parts overhead` does for
the file store, K-step runs of `bench.lookup_agent`, with this store in its default durability and
with `fsync=False` (benchmarked apart: it does not count for issue 22's targets) next to
pydantic-ai-harness's file store, rounds alternating the four configurations (none, ours, ours
without fsync, theirs) in one process, and the flushes and files synced per step of ours.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic_ai import Agent
from pydantic_ai.messages import (
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.usage import UsageLimits

from step_persistence import (
    ContinuableSnapshot,
    FileStepStore,
    RunRecord,
    StepEvent,
    StepPersistence,
    StepStore,
    ToolEffectRecord,
)
from step_persistence._history import encode_message

TOOL_RESULT = 'lorem ipsum ' * 20


class TimedStore:
    """Delegates to a store, adding up the time its coroutines take."""

    def __init__(self, store: FileStepStore) -> None:
        self.store = store
        self.seconds = 0.0

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.store, name)

        async def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return await method(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - start

        return timed


@dataclass(frozen=True)
class Sample:
    """The counters and clocks when one step's tool ran."""

    seconds: float
    store_seconds: float
    bytes_read: int
    bytes_written: int
    history_bytes: int


async def run_agent(steps: int, every: int, directory: Path, *, fsync: bool) -> list[Sample]:
    store = FileStepStore(directory, fsync=fsync)
    timed = TimedStore(store)
    samples: list[Sample] = []
    history_bytes = 0

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        nonlocal history_bytes
        step = (len(messages) - 1) // 2
        if step % every == 0:  # measuring the history costs O(history): only where it is reported
            history_bytes = len(ModelMessagesTypeAdapter.dump_json(messages))
        if step >= steps:
            return ModelResponse(parts=[TextPart('done')])
        return ModelResponse(parts=[ToolCallPart('lookup', {'step': step}, f'call-{step}')])

    as_store: StepStore = timed  # TimedStore has every StepStore method, through __getattr__
    agent = Agent(FunctionModel(respond), capabilities=[StepPersistence(store=as_store, agent_name='bench')])

    @agent.tool_plain
    def lookup(step: int) -> str:
        counters = store.io_counters
        samples.append(
            Sample(time.perf_counter(), timed.seconds, counters.bytes_read, counters.bytes_written, history_bytes)
        )
        return f'result of step {step}: {TOOL_RESULT}'

    await agent.run('start a long run', usage_limits=UsageLimits(request_limit=None))
    return samples


async def run_store(steps: int, every: int, directory: Path, *, fsync: bool) -> list[Sample]:
    """The store calls the capability makes for each tool-calling step, with no agent around them."""
    store = FileStepStore(directory, fsync=fsync)
    timed = TimedStore(store)
    await store.register_run(RunRecord(run_id='bench'))
    messages: list[ModelMessage] = [ModelRequest(parts=[UserPromptPart('start a long run')])]
    encoded = [encode_message(messages[0])]
    samples: list[Sample] = []
    for step in range(steps):
        counters = store.io_counters
        history_bytes = len(ModelMessagesTypeAdapter.dump_json(messages)) if step % every == 0 else 0
        samples.append(
            Sample(time.perf_counter(), timed.seconds, counters.bytes_read, counters.bytes_written, history_bytes)
        )
        call_id = f'call-{step}'
        messages.append(ModelResponse(parts=[ToolCallPart('lookup', {'step': step}, call_id)]))
        messages.append(
            ModelRequest(parts=[ToolReturnPart('lookup', f'result of step {step}: {TOOL_RESULT}', call_id)])
        )
        encoded.extend(encode_message(message) for message in messages[-2:])
        for kind in ('model_request_started', 'model_request_completed', 'tool_call_started', 'tool_call_completed'):
            await timed.append_event(
                StepEvent(run_id='bench', kind=kind, step_index=step, idempotency_key=f'{kind}:{step}')
            )
        for status in ('started', 'completed'):
            effect = ToolEffectRecord(run_id='bench', tool_call_id=call_id, tool_name='lookup', status=status)
            await timed.record_tool_effect(effect)
        snapshot = ContinuableSnapshot.from_encoded(
            run_id='bench',
            step_index=step,
            messages=list(messages),
            encoded=tuple(encoded),
            state='complete',
            conversation_id=None,
            parent_run_id=None,
            agent_name=None,
            idempotency_key=f'snapshot:{step}',
        )
        await timed.save_snapshot(snapshot)
    return samples


def report(samples: list[Sample], every: int, *, fsync: bool, mode: str) -> None:
    print(f'{mode}, fsync={fsync}; per step, averaged over the {every} steps up to the one shown\n')
    print('| step | history JSON | bytes written / step | bytes read / step | store ms / step | total ms / step |')
    print('|---:|---:|---:|---:|---:|---:|')
    for end in range(every, len(samples), every):
        first, last = samples[end - every], samples[end]

        def per_step(field: Callable[[Sample], float], first: Sample = first, last: Sample = last) -> float:
            return (field(last) - field(first)) / every

        written = per_step(lambda sample: sample.bytes_written)
        read = per_step(lambda sample: sample.bytes_read)
        store_ms = per_step(lambda sample: sample.store_seconds) * 1000
        total_ms = per_step(lambda sample: sample.seconds) * 1000
        print(f'| {end} | {last.history_bytes:,} | {written:,.0f} | {read:,.0f} | {store_ms:.2f} | {total_ms:.2f} |')


async def next_to_harness(steps_list: list[int], rounds: int, directory: Path) -> None:
    """Overhead per step (median over `rounds` alternating rounds) of each configuration, in a table."""
    import bench  # the benchmark environment's: pydantic-ai-harness, the agent bench.py times

    ours = {
        'ours': FileStepStore(directory / 'ours'),
        'ours, fsync=False': FileStepStore(directory / 'fast', fsync=False),
    }
    theirs = (await bench.open_store('theirs', 'file', directory, bench.Servers())).store
    stores: dict[str, Any] = {**ours, 'theirs': theirs}

    def capabilities(name: str) -> list[Any]:
        if name == 'none':
            return []
        return [bench.capability('theirs' if name == 'theirs' else 'ours', stores[name])]

    for name in stores:  # warm up
        await bench.run_agent(3, capabilities(name))
    print('| K | configuration | overhead ms/step (wall / CPU) | theirs / this (wall) | flushes / files synced |')
    print('|---:|---|---:|---:|---:|')
    for steps in steps_list:
        clocks: dict[str, tuple[list[float], list[float]]] = {name: ([], []) for name in ['none', *stores]}
        synced: dict[str, tuple[int, int]] = {}
        for _ in range(rounds):
            for name, (walls, cpus) in clocks.items():
                counters = ours[name].io_counters if name in ours else None
                before = (counters.flushes, counters.files_synced) if counters else (0, 0)
                wall, cpu = time.perf_counter(), time.process_time()
                await bench.run_agent(steps, capabilities(name))
                walls.append(time.perf_counter() - wall)
                cpus.append(time.process_time() - cpu)
                if counters:
                    synced[name] = (counters.flushes - before[0], counters.files_synced - before[1])

        wall = {name: _overhead(clocks[name][0], clocks['none'][0], steps) for name in stores}
        cpu = {name: _overhead(clocks[name][1], clocks['none'][1], steps) for name in stores}
        for name in stores:
            flushes, files = synced.get(name, (0, 0))
            counts = f'{flushes / steps:.2f} / {files / steps:.2f} per step' if name in ours else 'n/a'
            ratio = wall['theirs'] / wall[name]
            print(f'| {steps} | {name} | {wall[name]:.2f} / {cpu[name]:.2f} | {ratio:.2f} | {counts} |')


def _overhead(seconds: list[float], bare: list[float], steps: int) -> float:
    """Milliseconds per step of the medians' difference."""
    return (statistics.median(seconds) - statistics.median(bare)) * 1e3 / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--steps', type=int, default=1000)
    parser.add_argument('--every', type=int, default=250)
    parser.add_argument('--no-fsync', dest='fsync', action='store_false')
    parser.add_argument('--store-only', action='store_true', help='time the store calls alone, without an agent')
    parser.add_argument('--next-to-harness', action='store_true', help="K-step runs next to the harness's file store")
    parser.add_argument('--steps-list', type=int, nargs='+', default=[10, 50], help='K for --next-to-harness')
    parser.add_argument('--rounds', type=int, default=7, help='rounds for --next-to-harness')
    arguments = parser.parse_args()
    if arguments.next_to_harness:
        with tempfile.TemporaryDirectory() as directory:
            asyncio.run(next_to_harness(arguments.steps_list, arguments.rounds, Path(directory)))
        return
    run = run_store if arguments.store_only else run_agent
    with tempfile.TemporaryDirectory() as directory:
        samples = asyncio.run(run(arguments.steps + 1, arguments.every, Path(directory), fsync=arguments.fsync))
    report(samples, arguments.every, fsync=arguments.fsync, mode='store only' if arguments.store_only else 'agent')


if __name__ == '__main__':
    main()
