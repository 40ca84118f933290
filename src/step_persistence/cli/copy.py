"""`step-persistence copy SRC DST`: copy every run between two stores of any kind."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from step_persistence.cli._common import (
    EXIT_FAILED,
    JsonOption,
    console,
    error_console,
    open_store,
    print_json,
    run,
)
from step_persistence.copying import CopyReport, RunCopy, copy_runs

__all__ = ['copy']


def _progress(enabled: bool) -> Progress:
    """A progress bar on stderr, shown only to a person at a terminal."""
    return Progress(
        TextColumn('[progress.description]{task.description}'),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=error_console,
        disable=not enabled,
        transient=False,
    )


def copy(
    source: Annotated[str, typer.Argument(help='Store URL to copy from.', show_default=False)],
    destination: Annotated[str, typer.Argument(help='Store URL to copy to.', show_default=False)],
    run_ids: Annotated[
        list[str] | None,
        typer.Option('--run', '-r', help='Copy only this run (repeat for several); every run by default.'),
    ] = None,
    json_output: JsonOption = False,
) -> None:
    """Copy every run (records, events, tool effects, snapshots and their media) from SOURCE to DESTINATION.

    Idempotent: runs already at the destination are skipped, a partial copy left by an
    interrupted run of this command is replaced, and a run the destination holds differently
    is reported and left alone (exit code 1).
    """

    async def main() -> CopyReport:
        async with open_store(source) as from_store, open_store(destination) as to_store:
            await to_store.get_run(run_id='reachable')  # an unreachable destination fails before any work
            total = len(set(run_ids)) if run_ids else len(await from_store.list_runs())
            with _progress(enabled=not json_output and error_console.is_terminal) as progress:
                task = progress.add_task('copying runs', total=total)

                def advance(result: RunCopy) -> None:
                    progress.update(task, advance=1, description=escape(f'{result.outcome} {result.run_id}'))

                report = await copy_runs(from_store, to_store, run_ids=run_ids or None, on_run=advance)
                progress.update(task, description='copied runs')
            return report

    report = run(main)
    if json_output:
        print_json(report)
    else:
        console.print(
            f'{len(report.copied)} run(s) copied'
            + (f' ({len(report.repaired)} partial copies replaced)' if report.repaired else '')
            + f', {len(report.skipped)} already at the destination, {len(report.failed)} failed',
            highlight=False,
        )
    if report.failed:
        for run_id, reason in report.failed.items():
            error_console.print(
                f'[bold red]error:[/] {escape(f"run {run_id!r} was not copied: {reason}")}', highlight=False
            )
        raise typer.Exit(EXIT_FAILED)
