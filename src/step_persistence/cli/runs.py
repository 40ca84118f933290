"""`step-persistence runs ...`: list, show, tree and unresolved runs."""

from __future__ import annotations

from typing import Annotated

import typer

from step_persistence.cli._common import (
    DEFAULT_STORE,
    JsonOption,
    StoreOption,
    console,
    open_store,
    parse_since,
    print_json,
    run,
)
from step_persistence.cli.render import (
    effects_table,
    events_table,
    run_tree,
    snapshots_table,
    summaries_table,
)
from step_persistence.reporting import run_tool_effects, summarize_run, summarize_runs
from step_persistence.status import RunStatus, load_run_tree

app = typer.Typer(help='Inspect persisted runs.', no_args_is_help=True)

RunArgument = Annotated[str, typer.Argument(help='The run id.')]


@app.command('list')
def list_runs(
    store: StoreOption = DEFAULT_STORE,
    conversation: Annotated[str | None, typer.Option(help='Only runs of this conversation.')] = None,
    parent: Annotated[str | None, typer.Option(help='Only runs delegated by this run.')] = None,
    agent: Annotated[str | None, typer.Option(help='Only runs of this agent name.')] = None,
    status: Annotated[RunStatus | None, typer.Option(help='Only runs in this status.')] = None,
    since: Annotated[str | None, typer.Option(help='Only runs started since: ISO-8601, or 30m, 12h, 7d.')] = None,
    json_output: JsonOption = False,
) -> None:
    """List runs, oldest first, with their status and counts."""
    cutoff = parse_since(since)

    async def main() -> None:
        async with open_store(store) as opened:
            records = [
                record
                for record in await opened.list_runs(parent_run_id=parent, conversation_id=conversation)
                if (agent is None or record.agent_name == agent) and (cutoff is None or record.started_at >= cutoff)
            ]
            summaries = [s for s in await summarize_runs(opened, records) if status is None or s.status == status]
        if json_output:
            print_json(summaries)
        else:
            console.print(summaries_table(summaries))

    run(main)


@app.command()
def show(run_id: RunArgument, store: StoreOption = DEFAULT_STORE, json_output: JsonOption = False) -> None:
    """Show one run: its record, event timeline, tool effects and snapshots."""

    async def main() -> None:
        async with open_store(store) as opened:
            record = await opened.get_run(run_id=run_id)
            if record is None:
                raise LookupError(f'run {run_id!r} does not exist')
            events = await opened.list_events(run_id=run_id)
            effects = await run_tool_effects(opened, run_id, events)
            snapshots = await opened.list_snapshots(run_id=run_id, include_interrupted=True)
            summary = await summarize_run(opened, record)
        if json_output:
            print_json(
                {
                    'run': record,
                    'summary': summary,
                    'events': events,
                    'tool_effects': effects,
                    'snapshots': [
                        s.model_dump(mode='json', exclude={'messages'}) | {'messages': len(s.messages)}
                        for s in snapshots
                    ],
                }
            )
            return
        console.print(summaries_table([summary], title=f'Run {run_id}'))
        console.print(events_table(events))
        console.print(effects_table(effects))
        console.print(snapshots_table(snapshots))

    run(main)


@app.command()
def tree(run_id: RunArgument, store: StoreOption = DEFAULT_STORE, json_output: JsonOption = False) -> None:
    """Show the delegation tree under a run, with statuses and unresolved effects."""

    async def main() -> None:
        async with open_store(store) as opened:
            root = await load_run_tree(opened, run_id)
        if json_output:
            print_json(root)
        else:
            console.print(run_tree(root))

    run(main)


@app.command()
def unresolved(store: StoreOption = DEFAULT_STORE, json_output: JsonOption = False) -> None:
    """List every run with tool calls whose side effects are uncertain (still `started`)."""

    async def main() -> None:
        async with open_store(store) as opened:
            found = [
                (record, effects)
                for record in await opened.list_runs()
                if (effects := await opened.list_unresolved_tool_effects(run_id=record.run_id))
            ]
        if json_output:
            print_json([{'run': record, 'unresolved': effects} for record, effects in found])
            return
        if not found:
            console.print('No run has unresolved tool effects.')
        for record, effects in found:
            console.print(effects_table(effects), style=None)
            console.print(f'  in run [bold]{record.run_id}[/] ({record.agent_name or "?"})\n')

    run(main)
