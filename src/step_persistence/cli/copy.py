"""`step-persistence copy SRC DST`: copy every run between two stores of any kind."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from step_persistence.cli._common import (
    EXIT_FAILED,
    JsonOption,
    escape,
    open_store,
    out,
    print_json,
    run,
    stderr,
)

if TYPE_CHECKING:
    from rich.progress import Progress

    from step_persistence.copying import CopyReport, RunCopy

__all__ = ['copy']


def _progress(enabled: bool) -> Progress:
    """A progress bar on stderr, shown only to a person at a terminal."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(
        TextColumn('[progress.description]{task.description}'),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=stderr(),
        disable=not enabled,
        transient=False,
    )


def copy(
    source: Annotated[str, typer.Argument(metavar='SRC', help='Store URL to copy from.', show_default=False)],
    destination: Annotated[str, typer.Argument(metavar='DST', help='Store URL to copy to.', show_default=False)],
    run_ids: Annotated[
        list[str] | None,
        typer.Option(
            '--run',
            '-r',
            metavar='RUN',
            help='Copy only this run (id or unique prefix in SRC; repeat for several); every run by default.',
        ),
    ] = None,
    json_output: JsonOption = False,
) -> None:
    """Copy every run (records, events, tool effects, snapshots and their media) from SOURCE to DESTINATION.

    SOURCE must exist and is only read. DESTINATION is created if missing (a SQL one is created or
    upgraded to the newest schema first). Idempotent: runs already at the destination are skipped,
    a partial copy left by an interrupted run of this command is replaced, and a run the
    destination holds differently is reported and left alone (exit code 1).
    """

    async def main() -> CopyReport:
        from step_persistence.cli._common import resolve_run_id
        from step_persistence.copying import copy_runs

        # The source is only read: it must exist, and nothing is created or migrated there. The destination
        # is written: a SQL one is created or upgraded first (so an unreachable one fails before any work).
        async with (
            open_store(source, given_as='SRC') as from_store,
            open_store(destination, create=True) as to_store,
        ):
            await to_store.get_run(run_id='reachable')
            chosen = [await resolve_run_id(from_store, given) for given in run_ids or ()]
            total = len(set(chosen)) if chosen else len(await from_store.list_runs())
            with _progress(enabled=not json_output and stderr().is_terminal) as progress:
                task = progress.add_task('copying runs', total=total)

                def advance(result: RunCopy) -> None:
                    progress.update(task, advance=1, description=escape(f'{result.outcome} {result.run_id}'))

                report = await copy_runs(from_store, to_store, run_ids=chosen or None, on_run=advance)
                progress.update(task, description='copied runs')
            return report

    report = run(main)
    if json_output:
        print_json(report)
    else:
        out().print(
            f'{len(report.copied)} run(s) copied'
            + (f' ({len(report.repaired)} partial copies replaced)' if report.repaired else '')
            + f', {len(report.skipped)} already at the destination, {len(report.failed)} failed',
            highlight=False,
        )
    if report.failed:
        for run_id, reason in report.failed.items():
            stderr().print(f'[bold red]error:[/] {escape(f"run {run_id!r} was not copied: {reason}")}', highlight=False)
        raise typer.Exit(EXIT_FAILED)
