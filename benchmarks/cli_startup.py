"""How long the `step-persistence` command takes to start, next to `python -c 'import sqlalchemy'` (issue 18, item 5).

Each command runs as a whole process (the installed console script), paired with the reference
process: reference, command, reference, command, ... so that both see the same machine load, and
each pair gives one ratio. Prints, per command, the min and median wall time of both and the
ratio of the mins and the median of the per-pair ratios, as a Markdown table; and the median of the
per-pair ratios of CPU time (user plus system), which waiting for a busy machine's cores changes
less than it changes wall time.

Output goes to `/dev/null` (not a terminal: tables are plain text, `cli/tables.py`), except on the
rows marked "at a terminal", whose stdout is a pseudo-terminal 120 columns wide (rich renders them).

The stores are made once, before measuring: a SQLite file and a file-store directory with 10
runs each (a run start, a tool call, an unresolved call in one run in three, a snapshot).

Every process, the reference's too, runs with Python's bytecode cache in a scratch directory
(`PYTHONPYCACHEPREFIX`), warmed before counting: what an installed package costs from its second
run on. `--compile-every-time` keeps the environment as it is instead; with
`PYTHONDONTWRITEBYTECODE=1` and a virtual environment installed without bytecode (as `uv sync`
leaves it by default), every process then compiles every module it imports, and the figures
follow the size of the source imported rather than the work of importing it.

Run from the repository's main environment (not benchmarks/pyproject.toml's):

    python3 -m uv run --locked python benchmarks/cli_startup.py [--rounds 9] [--compile-every-time]
"""

from __future__ import annotations

import argparse
import asyncio
import fcntl
import os
import pty
import resource
import statistics
import struct
import subprocess
import sys
import tempfile
import termios
import threading
import time
from pathlib import Path

REFERENCE = [sys.executable, '-c', 'import sqlalchemy']
SCRIPT = Path(sys.executable).with_name('step-persistence')
FLOOR = 'import typer, typer.core, pydantic, sqlalchemy, sqlalchemy.dialects.sqlite'
"""What a command printing a table of records read from SQLite into a pipe cannot do without: the command
line's library, the records' pydantic, SQLAlchemy's core and its SQLite dialect."""
STORE_LIBRARIES = f'{FLOOR}, pydantic.main, sqlite3'
"""Every library `runs list` imports on a SQLite store (`python -X importtime`): the floor, pydantic's models
(the records; `import pydantic` imports them on first use) and Python's `sqlite3`."""
NO_COLLECTION = 'import gc; gc.disable()'
"""How the command line imports them: without collecting garbage until its store is open."""
TARGETS = {'--help': 1.5, 'runs list': 1.5, 'report': 2.0}
"""Issue 18's targets: at most this many times the reference."""


async def populate(url: str, runs: int = 10) -> None:
    from pydantic_ai.messages import ModelRequest, UserPromptPart

    from step_persistence import ContinuableSnapshot, RunRecord, StepEvent, ToolEffectRecord, from_spec

    async with from_spec(url) as store:
        for number in range(runs):
            run_id = f'agent.-run-{number:02d}'
            await store.register_run(RunRecord(run_id=run_id, agent_name='agent'))
            await store.append_event(StepEvent(run_id=run_id, kind='run_started', step_index=0))
            call = ToolEffectRecord(run_id=run_id, tool_call_id='call-1', tool_name='search', status='started')
            await store.record_tool_effect(call)
            await store.append_event(
                StepEvent(
                    run_id=run_id, kind='tool_call_started', step_index=1, tool_call_id='call-1', tool_name='search'
                )
            )
            if number % 3:
                await store.record_tool_effect(call.model_copy(update={'status': 'completed'}))
                await store.append_event(StepEvent(run_id=run_id, kind='run_completed', step_index=2))
            messages = [ModelRequest(parts=[UserPromptPart(f'question {number}')])]
            await store.save_snapshot(ContinuableSnapshot(run_id=run_id, step_index=1, messages=messages))


def child_environment(bytecode: Path | None) -> dict[str, str]:
    """The environment of every measured process: with the bytecode cache under `bytecode`, or as it is (`None`)."""
    if bytecode is None:
        return dict(os.environ)
    environment = {name: value for name, value in os.environ.items() if name != 'PYTHONDONTWRITEBYTECODE'}
    return {**environment, 'PYTHONPYCACHEPREFIX': str(bytecode)}


def wall(command: list[str], environment: dict[str, str], *, terminal: bool = False) -> float:
    """Seconds `command` takes from start to exit, its stdout `/dev/null` or (`terminal`) a pseudo-terminal."""
    if terminal:
        return _wall_at_a_terminal(command, environment)
    started = time.perf_counter()
    completed = subprocess.run(
        command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, check=False, env=environment
    )
    elapsed = time.perf_counter() - started
    if completed.returncode != 0:
        raise SystemExit(f'{" ".join(command)} failed ({completed.returncode}): {completed.stderr}')
    return elapsed


def _wall_at_a_terminal(command: list[str], environment: dict[str, str]) -> float:
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack('HHHH', 40, 120, 0, 0))

    def drain() -> None:
        try:
            while os.read(leader, 65536):
                pass
        except OSError:  # EIO: the terminal has no writer left
            pass

    reader = threading.Thread(target=drain)
    reader.start()
    try:
        started = time.perf_counter()
        completed = subprocess.run(
            command, stdout=follower, stderr=subprocess.PIPE, text=True, check=False, env=environment
        )
        elapsed = time.perf_counter() - started
    finally:
        os.close(follower)
        reader.join(timeout=30)
        os.close(leader)
    if completed.returncode != 0:
        raise SystemExit(f'{" ".join(command)} failed ({completed.returncode}): {completed.stderr}')
    return elapsed


def cpu_seconds_of_children() -> float:
    """User plus system CPU seconds of every child process ended so far."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed(command: list[str], environment: dict[str, str], *, terminal: bool = False) -> tuple[float, float]:
    """`command`'s wall seconds (`wall`) and the CPU seconds its process used."""
    before = cpu_seconds_of_children()
    elapsed = wall(command, environment, terminal=terminal)
    return elapsed, cpu_seconds_of_children() - before


def measure(command: list[str], rounds: int, environment: dict[str, str], *, terminal: bool) -> dict[str, float]:
    wall(REFERENCE, environment)  # warm the file and bytecode caches for both before counting anything
    wall(command, environment, terminal=terminal)
    references, commands, ratios, cpu_ratios = [], [], [], []
    for _ in range(rounds):
        (reference, reference_cpu), (measured, measured_cpu) = (
            timed(REFERENCE, environment),
            timed(command, environment, terminal=terminal),
        )
        references.append(reference)
        commands.append(measured)
        ratios.append(measured / reference)
        cpu_ratios.append(measured_cpu / reference_cpu)
    return {
        'reference_min': min(references),
        'reference_median': statistics.median(references),
        'min': min(commands),
        'median': statistics.median(commands),
        'ratio_of_mins': min(commands) / min(references),
        'median_ratio': statistics.median(ratios),
        'median_cpu_ratio': statistics.median(cpu_ratios),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--rounds', type=int, default=9, help='pairs per command (default 9)')
    parser.add_argument('--only', nargs='*', default=[], help='measure only the rows whose name contains one of these')
    parser.add_argument(
        '--compile-every-time', action='store_true', help='no bytecode cache: the environment as it is (see above)'
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        environment = child_environment(None if args.compile_every_time else Path(scratch, 'bytecode'))
        sqlite_url = f'sqlite:///{Path(scratch, "runs.db")}'
        file_url = f'file://{Path(scratch, "runs")}'
        asyncio.run(populate(sqlite_url))
        asyncio.run(populate(file_url))
        commands = {
            '--help': [str(SCRIPT), '--help'],
            'runs --help': [str(SCRIPT), 'runs', '--help'],
            'runs list': [str(SCRIPT), 'runs', 'list', '--store', sqlite_url],
            'runs list (file store)': [str(SCRIPT), 'runs', 'list', '--store', file_url],
            'runs list (at a terminal)': [str(SCRIPT), 'runs', 'list', '--store', sqlite_url],
            'report': [str(SCRIPT), 'report', '--store', sqlite_url],
            'report (file store)': [str(SCRIPT), 'report', '--store', file_url],
            'report (at a terminal)': [str(SCRIPT), 'report', '--store', sqlite_url],
            'db current': [str(SCRIPT), 'db', 'current', '--store', sqlite_url],
            # What `runs list` and `report` on SQLite no longer import (a snapshot's messages need it), what
            # they import, and the part of it no such command can do without.
            "python -c 'import pydantic_ai.messages'": [sys.executable, '-c', 'import pydantic_ai.messages'],
            # Imported as the command line imports them (`_common.hold_collection`).
            'libraries imported by runs list on SQLite': [sys.executable, '-c', f'{NO_COLLECTION}; {STORE_LIBRARIES}'],
            'their floor (typer, pydantic, SQLAlchemy core and SQLite dialect)': [
                sys.executable,
                '-c',
                f'{NO_COLLECTION}; {FLOOR}',
            ],
        }
        if args.only:
            commands = {name: command for name, command in commands.items() if any(part in name for part in args.only)}
        cache = 'every module compiled in every process' if args.compile_every_time else 'bytecode cached'
        print(
            f"Each row: {args.rounds} pairs (`python -c 'import sqlalchemy'`, then the command), "
            f'whole processes, wall seconds, {cache}.\n'
        )
        print(
            '| command | reference min / median | command min / median | median ratio | ratio of mins '
            '| median CPU ratio | target |'
        )
        print('|---|---|---|---|---|---|---|')
        for name, command in commands.items():
            figures = measure(command, args.rounds, environment, terminal='at a terminal' in name)
            target = TARGETS.get(name)
            verdict = (
                '' if target is None else f'{target}x: ' + ('met' if figures['median_ratio'] <= target else 'not met')
            )
            print(
                f'| `{name}` | {figures["reference_min"]:.2f} / {figures["reference_median"]:.2f} s '
                f'| {figures["min"]:.2f} / {figures["median"]:.2f} s | {figures["median_ratio"]:.2f} '
                f'| {figures["ratio_of_mins"]:.2f} | {figures["median_cpu_ratio"]:.2f} | {verdict} |',
                flush=True,
            )


if __name__ == '__main__':
    main()
