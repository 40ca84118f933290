"""Issue 21's benchmark: durable runs (`StepDurability` + `StepPersistence`) next to `StepPersistence` alone and
next to pydantic-ai's `DBOSAgent`, on SQLite, in one process and one run.

Run with `make bench` or `cd benchmarks/durable && uv run python durable_bench.py` (its own environment:
pydantic-ai-slim 2.68 with the dbos extra, dbos, this package from the repository). It writes its tables into
`benchmarks/RESULTS.md` between its own markers (or to `--output`).

Every agent is a `FunctionModel` agent (no network) that calls one tool per step, K times, then answers. The
configurations, alternated round by round (their order rotated each round) on stores opened once per run:

- `none`: the bare agent;
- `persistence`: `StepPersistence` on a SQLite store;
- `durable`: `StepPersistence` + `StepDurability` on one SQLite store (what issue 21 ships);
- `durable, FULL`: the same on a store opened with `synchronous='FULL'`, so that every commit is fsynced, as
  every commit of DBOS's SQLite system database is (its default: rollback journal, `synchronous=FULL`);
- `durable only`: `StepDurability` alone on a SQLite store of its own;
- `dbos`: `DBOSAgent` (the `dbos` package as a black box) with a SQLite system database, its tool a
  `@DBOS.step` (DBOS journals a function tool only when it is a step: by hand), each run a workflow of its own id.

Overhead per step is (median time of a configuration - median time of `none`) / K, wall (`time.perf_counter`)
and CPU (`time.process_time`, the whole process, worker threads included).

Replay (K = `--replay-steps`, 50 by default), for a workflow id that was run before, timed on the second run:
- `completed`: the same id and inputs re-run after the run completed;
- `crashed`: the run was interrupted inside its last tool call (its task cancelled there, which leaves that unit
  in flight as a crash would; the tool is marked idempotent, so it runs again) and re-run: everything before it
  replays, the last tool call and the final model request execute. DBOS is timed on `completed` only: in the
  process that started it, a cancelled workflow is still pending to DBOS, and re-running its id waits for it;
  DBOS resumes pending workflows when a process launches.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.metadata
import logging
import os
import platform
import statistics
import tempfile
import time
import uuid
import warnings
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

warnings.filterwarnings('ignore')  # DBOSAgent is deprecated in favour of DBOSDurability on pydantic-ai 2.68

from dbos import DBOS, SetWorkflowID  # noqa: E402
from pydantic_ai import Agent, Tool  # noqa: E402
from pydantic_ai.durable_exec.dbos import DBOSAgent  # noqa: E402
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, UserPromptPart  # noqa: E402
from pydantic_ai.models.function import AgentInfo, FunctionModel  # noqa: E402
from pydantic_ai.usage import UsageLimits  # noqa: E402

from step_persistence import SqliteStepStore, StepPersistence  # noqa: E402
from step_persistence.durable import StepDurability  # noqa: E402

RESULTS = Path(__file__).resolve().parents[1] / 'RESULTS.md'
BEGIN = '<!-- durable_bench.py writes from here -->'
END = '<!-- durable_bench.py writes to here -->'
TOOL_RESULT = 'lorem ipsum ' * 20
LIMITS = UsageLimits(request_limit=None)
CONFIGURATIONS = ('none', 'persistence', 'durable', 'durable, FULL', 'durable only', 'dbos')
DBOS_TIMEOUT = 120.0


def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """One tool call per step until the step count in the prompt (the first message) is reached, then 'done'."""
    prompt = next(part for part in messages[0].parts if isinstance(part, UserPromptPart))
    steps = int(str(prompt.content))
    step = sum(isinstance(message, ModelResponse) for message in messages)
    if step < steps:
        return ModelResponse(parts=[ToolCallPart('lookup', {'step': step}, f'call-{step}')])
    return ModelResponse(parts=[TextPart('done')])


@dataclass
class Interruption:
    """Makes the tool call of step `at` wait forever (after saying so) until its run is cancelled."""

    at: int | None = None
    inside: asyncio.Event = field(default_factory=asyncio.Event)


INTERRUPTION = Interruption()


async def lookup(step: int) -> str:
    if step == INTERRUPTION.at:
        INTERRUPTION.inside.set()
        await asyncio.Event().wait()
    return f'{step}: {TOOL_RESULT}'


@DBOS.step(name='lookup')
async def dbos_lookup(step: int) -> str:
    return await lookup(step)


Run = Callable[[int, str], Coroutine[Any, Any, None]]


def ours_agent(capabilities: list[Any]) -> Run:
    agent = Agent(
        FunctionModel(respond),
        name='bench',
        tools=[Tool(lookup, name='lookup', metadata={'step_persistence': {'idempotent': True}})],
        capabilities=capabilities,
    )

    async def run(steps: int, workflow_id: str) -> None:
        result = await agent.run(str(steps), usage_limits=LIMITS, run_id=workflow_id)
        assert result.output == 'done', result.output

    return run


def dbos_agent() -> Run:
    """A `DBOSAgent`; built before `DBOS.launch()`, as DBOS registers its workflows then."""
    wrapped = Agent(FunctionModel(respond), name='dbos_bench')
    wrapped.tool_plain(name='lookup')(dbos_lookup)
    agent = DBOSAgent(wrapped)

    async def run(steps: int, workflow_id: str) -> None:
        with SetWorkflowID(workflow_id):
            result = await asyncio.wait_for(agent.run(str(steps), usage_limits=LIMITS), DBOS_TIMEOUT)
        assert result.output == 'done', result.output

    return run


@dataclass
class Clock:
    wall: list[float] = field(default_factory=list[float])
    cpu: list[float] = field(default_factory=list[float])

    def median(self, kind: str) -> float:
        return statistics.median(self.wall if kind == 'wall' else self.cpu)


@contextlib.contextmanager
def clocked(clock: Clock) -> Iterator[None]:
    wall, cpu = time.perf_counter(), time.process_time()
    yield
    clock.wall.append(time.perf_counter() - wall)
    clock.cpu.append(time.process_time() - cpu)


async def interrupted(run: Run, steps: int, workflow_id: str) -> None:
    """Runs `workflow_id` until its last tool call is inside its body, then cancels it there."""
    INTERRUPTION.at, INTERRUPTION.inside = steps - 1, asyncio.Event()
    task = asyncio.create_task(run(steps, workflow_id))
    try:
        await INTERRUPTION.inside.wait()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    finally:
        INTERRUPTION.at = None


@dataclass
class Measured:
    runs: dict[tuple[str, int], Clock] = field(default_factory=dict[tuple[str, int], Clock])
    replays: dict[tuple[str, str], Clock] = field(default_factory=dict[tuple[str, str], Clock])
    """(configuration, 'completed' or 'crashed') -> time of the second run of a `--replay-steps` workflow."""


async def measure(arguments: argparse.Namespace, root: Path) -> Measured:
    DBOS(
        config={
            'name': 'durable_bench',
            'system_database_url': f'sqlite:///{root / "dbos.sqlite"}',
            'log_level': 'ERROR',
        }
    )
    runs: dict[str, Run] = {'dbos': dbos_agent()}
    DBOS.launch()
    logging.getLogger('dbos').setLevel(logging.ERROR)
    measured = Measured()
    try:
        async with (
            SqliteStepStore(root / 'persistence.db') as alone,
            SqliteStepStore(root / 'durable.db') as both,
            SqliteStepStore(root / 'durable-full.db', synchronous='FULL') as fsynced,
            SqliteStepStore(root / 'durable-only.db') as journal_only,
        ):
            runs['none'] = ours_agent([])
            runs['persistence'] = ours_agent([StepPersistence(alone)])
            runs['durable'] = ours_agent([StepPersistence(both), StepDurability(both)])
            runs['durable, FULL'] = ours_agent([StepPersistence(fsynced), StepDurability(fsynced)])
            runs['durable only'] = ours_agent([StepDurability(journal_only)])
            for name in CONFIGURATIONS:  # warm up: schemas, connections, imports
                await runs[name](3, str(uuid.uuid4()))
            for steps in arguments.steps:
                for index in range(arguments.rounds):
                    shift = index % len(CONFIGURATIONS)
                    order = CONFIGURATIONS[shift:] + CONFIGURATIONS[:shift]
                    for name in order:
                        with clocked(measured.runs.setdefault((name, steps), Clock())):
                            await runs[name](steps, str(uuid.uuid4()))
                print(
                    f'K={steps}: '
                    + ', '.join(f'{n} {measured.runs[n, steps].median("wall") * 1e3:.0f} ms' for n in CONFIGURATIONS),
                    flush=True,
                )
            steps = arguments.replay_steps
            for index in range(arguments.rounds):
                for name in ('durable', 'durable only', 'dbos'):
                    workflow_id = str(uuid.uuid4())
                    await runs[name](steps, workflow_id)
                    with clocked(measured.replays.setdefault((name, 'completed'), Clock())):
                        await runs[name](steps, workflow_id)
                    if name == 'dbos':
                        continue
                    workflow_id = str(uuid.uuid4())
                    await interrupted(runs[name], steps, workflow_id)
                    with clocked(measured.replays.setdefault((name, 'crashed'), Clock())):
                        await runs[name](steps, workflow_id)
                print(f'replay round {index + 1} done', flush=True)
            for name in ('durable', 'durable only', 'dbos'):  # the original runs, alternated like the replays
                if (name, steps) not in measured.runs:
                    for _ in range(arguments.rounds):
                        with clocked(measured.runs.setdefault((name, steps), Clock())):
                            await runs[name](steps, str(uuid.uuid4()))
    finally:
        DBOS.destroy()
    return measured


def render(arguments: argparse.Namespace, measured: Measured, started: str, load: tuple[float, float, float]) -> str:
    lines = [
        f'Run of {started} UTC: `python durable_bench.py {" ".join(arguments.argv)}`.',
        f'{arguments.rounds} rounds; Python {platform.python_version()}, pydantic-ai-slim '
        f'{importlib.metadata.version("pydantic-ai-slim")}, dbos {importlib.metadata.version("dbos")}, '
        f'{os.cpu_count()} CPUs, load average before {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f}.',
        '',
        '| K | configuration | median wall ms | median CPU ms | overhead ms/step wall | CPU | '
        "overhead / dbos's wall | CPU |",
        '|---|---|---|---|---|---|---|---|',
    ]
    for steps in arguments.steps:
        none = measured.runs['none', steps]

        def overhead(name: str, kind: str, steps: int = steps, none: Clock = none) -> float:
            return (measured.runs[name, steps].median(kind) - none.median(kind)) * 1e3 / steps

        for name in CONFIGURATIONS:
            clock = measured.runs[name, steps]
            row = [str(steps), name, f'{clock.median("wall") * 1e3:.1f}', f'{clock.median("cpu") * 1e3:.1f}']
            if name == 'none':
                row += ['', '', '', '']
            else:
                row += [f'{overhead(name, "wall"):.2f}', f'{overhead(name, "cpu"):.2f}']
                row += [
                    f'{overhead(name, kind) / overhead("dbos", kind):.2f}' if name != 'dbos' else ''
                    for kind in ('wall', 'cpu')
                ]
            lines.append('| ' + ' | '.join(row) + ' |')
    steps = arguments.replay_steps
    lines += [
        '',
        f'Replay of a {steps}-step workflow (the second run of its id), next to a first run of the same configuration:',
        '',
        '| configuration | replay | median wall ms | median CPU ms | / first run, wall | CPU |',
        '|---|---|---|---|---|---|',
    ]
    for (name, kind), clock in measured.replays.items():
        first = measured.runs[name, steps]
        lines.append(
            f'| {name} | {kind} | {clock.median("wall") * 1e3:.1f} | {clock.median("cpu") * 1e3:.1f} | '
            f'{clock.median("wall") / first.median("wall"):.3f} | {clock.median("cpu") / first.median("cpu"):.3f} |'
        )
    bare = measured.runs.get(('none', steps))
    if bare is not None:
        wall, cpu = bare.median('wall') * 1e3, bare.median('cpu') * 1e3
        lines.append(f'| none | (a first run, for scale) | {wall:.1f} | {cpu:.1f} | | |')
    return '\n'.join(lines) + '\n'


def write(path: Path, table: str) -> None:
    """Replaces what is between the markers in `path` (appends them, with the table, if absent)."""
    text = path.read_text() if path.exists() else ''
    block = f'{BEGIN}\n\n{table}\n{END}'
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        text = head + block + rest.split(END, 1)[1]
    else:
        text = text.rstrip() + '\n\n' + block + '\n'
    path.write_text(text)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--steps', type=int, nargs='+', default=[10, 50], help='K values (default: 10 50)')
    parser.add_argument('--replay-steps', type=int, default=50, help='K of the replayed workflows (default: 50)')
    parser.add_argument('--rounds', type=int, default=7, help='rounds per measurement (default: 7)')
    parser.add_argument(
        '--output', type=Path, default=RESULTS, help=f'the file whose marked part is rewritten (default: {RESULTS})'
    )
    arguments = parser.parse_args(argv)
    arguments.argv = [] if argv is None else argv
    return arguments


def main(arguments: argparse.Namespace) -> None:
    started = time.strftime('%Y-%m-%d %H:%M', time.gmtime())
    load = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix='durable-bench-') as directory:
        measured = asyncio.run(measure(arguments, Path(directory)))
    table = render(arguments, measured, started, load)
    print(table)
    write(arguments.output, table)


if __name__ == '__main__':
    import sys

    main(parse(sys.argv[1:]))
