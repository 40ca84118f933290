"""`step-persistence prune` and `step-persistence gc`: remove old runs, then the media nothing refers to."""

from __future__ import annotations

from datetime import UTC, datetime
from functools import partial
from typing import TYPE_CHECKING, Annotated, cast

import typer

from step_persistence.cli._common import (
    DEFAULT_STORE,
    EXIT_USAGE,
    RUN_STATUS_NAMES,
    JsonOption,
    RunStatusName,
    StoreOption,
    escape,
    fail,
    open_store,
    out,
    parse_duration,
    print_json,
    run,
    warn,
)

if TYPE_CHECKING:
    from step_persistence.reclaiming import MediaCollection

__all__ = ['gc', 'prune']


def prune(
    older_than: Annotated[
        str,
        typer.Option(
            '--older-than',
            metavar='DURATION',
            help='Delete runs that started longer ago than this: 90s, 30m, 12h, 30d, 2w.',
            show_default=False,
        ),
    ],
    store: StoreOption = DEFAULT_STORE,
    status: Annotated[
        list[str] | None,
        typer.Option(
            '--status',
            metavar='STATUS',
            help='Only runs in this status: completed, failed, crashed, running (repeat for several); any by default.',
            show_default=False,
        ),
    ] = None,
    include_running: Annotated[
        bool, typer.Option('--include-running', help='Also delete runs that still look alive (status running).')
    ] = False,
    dry_run: Annotated[bool, typer.Option('--dry-run', help='Only list the runs that would be deleted.')] = False,
    json_output: JsonOption = False,
) -> None:
    """Delete whole old runs (record, events, tool effects, snapshots), oldest first.

    A run's status is judged as in `runs list`; a `running` run is kept unless --include-running.
    Media shared with other runs stays; `gc` removes what nothing refers to any more.
    """
    cutoff = datetime.now(UTC) - parse_duration(older_than, '--older-than')
    unknown = sorted(set(status or ()) - set(RUN_STATUS_NAMES))
    if unknown:
        fail(f'unknown --status {", ".join(unknown)}; choose from {", ".join(sorted(RUN_STATUS_NAMES))}', EXIT_USAGE)
    statuses = {cast(RunStatusName, name) for name in status} if status else None
    if statuses is not None and 'running' in statuses and not include_running:
        fail('--status running needs --include-running (running runs are kept otherwise)', EXIT_USAGE)

    async def main() -> list[str]:
        from step_persistence.lifecycle import prunable_runs

        async with open_store(store) as opened:
            select = partial(prunable_runs, opened) if dry_run else opened.prune_runs
            return await select(older_than=cutoff, statuses=statuses, include_running=include_running)

    run_ids = run(main)
    if json_output:
        print_json({'dry_run': dry_run, 'older_than': cutoff, 'runs': run_ids})
        return
    verb = 'would delete' if dry_run else 'deleted'
    out().print(f'{verb} {len(run_ids)} run(s) started before {cutoff.isoformat(timespec="seconds")}', highlight=False)
    for run_id in run_ids:
        out().print(f'  {escape(run_id)}', highlight=False)


def gc(
    store: StoreOption = DEFAULT_STORE,
    grace: Annotated[
        str,
        typer.Option(
            '--grace',
            metavar='DURATION',
            help='Keep anything written more recently than this (a write may still refer to it).',
        ),
    ] = '1h',
    json_output: JsonOption = False,
) -> None:
    """Remove stored message versions and media blobs that no retained snapshot refers to any more.

    Run it after `prune` (or deleting runs); what was written within --grace is kept, since a
    write in progress may still come to refer to it.
    """
    from step_persistence.media.clock import REUSE_WINDOW

    grace_period = parse_duration(grace, '--grace')
    if grace_period <= REUSE_WINDOW:
        warn(
            f'--grace {grace} is within the media reuse window ({REUSE_WINDOW}): '
            'safe only while no process is writing to the store'
        )

    async def main() -> MediaCollection:
        async with open_store(store) as opened:
            return await opened.collect_media(grace=grace_period)

    collected = run(main)
    if json_output:
        print_json({'messages': collected.messages, 'blobs': collected.blobs})
        return
    out().print(
        f'removed {collected.messages} unreferenced stored message(s) and {collected.blobs} media blob(s)',
        highlight=False,
    )
