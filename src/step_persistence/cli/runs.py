"""`step-persistence runs ...`: list, show, tree, unresolved, messages, delete and resolve runs.

Every command that takes a run id takes a unique prefix of one (`_common.resolve_run_id`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Annotated, Literal

import typer

from step_persistence.cli._common import (
    DEFAULT_STORE,
    EXIT_FAILED,
    Command,
    Group,
    JsonOption,
    RunArgument,
    RunStatusName,
    StoreOption,
    display,
    escape,
    fail,
    open_store,
    out,
    parse_since,
    print_json,
    resolve_run_id,
    run,
    warn,
)

if TYPE_CHECKING:
    from step_persistence.cli.lineage import Continuation
    from step_persistence.protocol import StepStore
    from step_persistence.reporting import RunSummary
    from step_persistence.status import RunNode

app = typer.Typer(help='Inspect, resolve and delete persisted runs.', no_args_is_help=True, cls=Group)

DEFAULT_LIMIT = 50


@app.command('list', cls=Command)
def list_runs(
    store: StoreOption = DEFAULT_STORE,
    conversation: Annotated[
        str | None, typer.Option(metavar='ID', help='Only runs of this conversation.', show_default=False)
    ] = None,
    parent: Annotated[
        str | None, typer.Option(metavar='RUN', help='Only runs delegated by this run (id or unique prefix).')
    ] = None,
    agent: Annotated[str | None, typer.Option(metavar='NAME', help='Only runs of this agent name.')] = None,
    status: Annotated[
        RunStatusName | None,
        typer.Option(metavar='STATUS', help='Only runs in this status: running, completed, failed or crashed.'),
    ] = None,
    since: Annotated[
        str | None, typer.Option(metavar='WHEN', help='Only runs started since: ISO-8601, or 30m, 12h, 7d.')
    ] = None,
    limit: Annotated[int, typer.Option(metavar='N', min=0, help='Show at most N runs (0: every run).')] = DEFAULT_LIMIT,
    oldest_first: Annotated[bool, typer.Option('--oldest-first/--newest-first', help='Order by start time.')] = False,
    json_output: JsonOption = False,
) -> None:
    """List runs, newest first, with their status and counts."""
    cutoff = parse_since(since)

    async def main() -> tuple[list[RunSummary], bool]:
        from step_persistence.cli.listing import candidate_runs, select_summaries

        async with open_store(store) as opened:
            parent_id = None if parent is None else await _parent_id(opened, parent)
            records = await candidate_runs(
                opened,
                parent_run_id=parent_id,
                conversation_id=conversation,
                agent_name=agent,
                since=cutoff,
                newest_first=not oldest_first,
                wanted=None if status is not None or not limit else limit + 1,
            )
            summaries, more = await select_summaries(opened, records, status=status, limit=limit or None)
            return summaries, more

    summaries, more = run(main)
    if json_output:
        print_json(summaries)
        return
    if not summaries:
        print('No run matches.' if status or agent or since or parent or conversation else 'No runs.')
        return
    from step_persistence.cli.tables import RUNS, show

    show(RUNS, summaries)
    if more:
        end = 'oldest' if oldest_first else 'newest'
        warn(f'showing the {end} {limit} matching runs; --limit N shows more, --limit 0 every one')


async def _parent_id(store: StepStore, given: str) -> str:
    """`--parent`: a run id or unique prefix; a run no longer stored is taken as the exact id its children name."""
    try:
        return await resolve_run_id(store, given)
    except LookupError:
        return given


@app.command(cls=Command)
def show(run_id: RunArgument, store: StoreOption = DEFAULT_STORE, json_output: JsonOption = False) -> None:
    """Show one run: its record, origin and continuations, event timeline, tool effects and snapshots."""

    async def main() -> None:
        from step_persistence.cli.lineage import continuations
        from step_persistence.reporting import run_tool_effects, summarize_run

        async with open_store(store) as opened:
            found = await resolve_run_id(opened, run_id)
            record = await opened.get_run(run_id=found)
            if record is None:
                raise LookupError(f'run {found!r} does not exist')
            events = await opened.list_events(run_id=found)
            effects = await run_tool_effects(opened, found, events)
            snapshots = await opened.list_snapshots(run_id=found, include_interrupted=True)
            summary = await summarize_run(opened, record)
            went_on = await continuations(opened, found)
        if json_output:
            print_json(
                {
                    'run': record,
                    'summary': summary,
                    'continuations': went_on,
                    'events': events,
                    'tool_effects': effects,
                    'snapshots': [
                        s.model_dump(exclude={'messages'}) | {'messages': len(s.messages)} for s in snapshots
                    ],
                }
            )
            return
        from step_persistence.cli.render import (
            continuation_text,
            effects_table,
            events_table,
            fitted_table,
            origin_text,
            print_fitted,
            snapshots_table,
        )
        from step_persistence.cli.tables import RUNS

        out().print(f'Run [bold]{escape(found)}[/]', soft_wrap=True, highlight=False)
        lineage = [] if record.origin is None else [origin_text(record.origin)]
        for line in [*lineage, *(continuation_text(each) for each in went_on)]:
            out().print(line, soft_wrap=True, highlight=False)
        print_fitted(out(), fitted_table(out(), dataclasses.replace(RUNS, title=None), [summary]))
        display(events_table(events))
        display(effects_table(effects))
        display(snapshots_table(snapshots))

    run(main)


@app.command(cls=Command)
def tree(run_id: RunArgument, store: StoreOption = DEFAULT_STORE, json_output: JsonOption = False) -> None:
    """Show the delegation tree under a run, with statuses, unresolved effects, origins and continuations."""

    async def main() -> None:
        from step_persistence.cli.lineage import continuations_of
        from step_persistence.status import load_run_tree

        async with open_store(store) as opened:
            root = await load_run_tree(opened, await resolve_run_id(opened, run_id))
            went_on = await continuations_of(opened, (node.record.run_id for node in _delegation_nodes(root)))
        if json_output:
            print_json(_tree_json(root, went_on))
            return
        from step_persistence.cli.render import print_fitted, run_tree

        print_fitted(out(), run_tree(root, went_on))

    run(main)


def _delegation_nodes(root: RunNode) -> list[RunNode]:
    """Every node of the tree under `root`, `root` first."""
    nodes, index = [root], 0
    while index < len(nodes):
        nodes.extend(nodes[index].children)
        index += 1
    return nodes


def _tree_json(node: RunNode, went_on: Mapping[str, Sequence[Continuation]]) -> dict[str, object]:
    """`runs tree --json` of a node: record, status, unresolved effects, the runs that went on from it, children."""
    return {
        'record': node.record,
        'status': node.status,
        'unresolved': node.unresolved,
        'continuations': list(went_on.get(node.record.run_id, ())),
        'children': [_tree_json(child, went_on) for child in node.children],
    }


@app.command(cls=Command)
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
            out().print('No run has unresolved tool effects.')
            return
        from step_persistence.cli.render import print_fitted, unresolved_table

        print_fitted(out(), unresolved_table([(record.run_id, effects) for record, effects in found]))

    run(main)


@app.command(cls=Command)
def messages(
    run_id: RunArgument,
    store: StoreOption = DEFAULT_STORE,
    seq: Annotated[
        int | None,
        typer.Option(metavar='N', help='The snapshot with this sequence number; the newest (of any state) by default.'),
    ] = None,
    json_output: JsonOption = False,
) -> None:
    """Print a run's message history from its newest snapshot (or snapshot N), media as media URIs."""

    async def main() -> None:
        from step_persistence.cli.history import history_text, history_tree

        async with open_store(store) as opened:
            found = await resolve_run_id(opened, run_id)
            snapshots = await opened.list_snapshots(run_id=found, include_interrupted=True)
        if not snapshots:
            raise LookupError(f'run {found!r} has no snapshot')
        if seq is None:
            snapshot = snapshots[-1]
        else:
            chosen = [snapshot for snapshot in snapshots if snapshot.seq == seq]
            if not chosen:
                retained = ', '.join(str(snapshot.seq) for snapshot in snapshots)
                raise LookupError(f'run {found!r} has no snapshot {seq} (retained: {retained})')
            snapshot = chosen[0]
        if json_output:
            print_json(
                {
                    'run_id': found,
                    'seq': snapshot.seq,
                    'step_index': snapshot.step_index,
                    'state': snapshot.state,
                    'timestamp': snapshot.timestamp,
                    'messages': history_tree(snapshot.messages),
                }
            )
            return
        for line in history_text(found, snapshot, len(snapshots)):
            out().print(line, highlight=False, soft_wrap=True)

    run(main)


@app.command(cls=Command)
def delete(
    run_id: RunArgument,
    store: StoreOption = DEFAULT_STORE,
    cascade: Annotated[
        bool, typer.Option('--cascade', help='Also delete every run delegated from it, transitively.')
    ] = False,
    json_output: JsonOption = False,
) -> None:
    """Delete a run: its record, events, tool effects, snapshots and stored messages (never shared media)."""

    async def main() -> tuple[str, list[str], int]:
        from step_persistence._delegation import DelegationWalk

        async with open_store(store) as opened:
            found = await resolve_run_id(opened, run_id)
            walk = DelegationWalk(found)
            while walk.level and cascade:
                walk.add_children(
                    [child.run_id for parent in walk.level for child in await opened.list_runs(parent_run_id=parent)]
                )
            kept = 0 if cascade else len(await opened.list_runs(parent_run_id=found))
            await opened.delete_run(run_id=found, cascade=cascade)
            return found, walk.found, kept

    found, delegated, kept = run(main)
    if json_output:
        print_json({'deleted': [found, *delegated]})
        return
    out().print(f'deleted run {escape(found)}', highlight=False, soft_wrap=True)
    for child in delegated:
        out().print(f'deleted delegated run {escape(child)}', highlight=False, soft_wrap=True)
    if kept:
        warn(f'{kept} run(s) delegated from it are kept (with a parent that no longer exists); --cascade deletes them')


@app.command(cls=Command)
def resolve(
    run_id: RunArgument,
    call: Annotated[
        str, typer.Argument(metavar='CALL', help='The tool call id (see `runs show` or `runs unresolved`).')
    ],
    status: Annotated[
        Literal['completed', 'failed'],
        typer.Option(help='What checking the outside world found: the side effect happened, or did not.'),
    ],
    summary: Annotated[
        str, typer.Option(metavar='TEXT', help='What was checked and found, kept as the effect summary.')
    ],
    store: StoreOption = DEFAULT_STORE,
    json_output: JsonOption = False,
) -> None:
    """Settle a tool call left unresolved (started) by a crash, after checking whether its side effect happened.

    The ledger record becomes COMPLETED or FAILED with SUMMARY, and an event records that it was
    resolved from outside the run (metadata resolved_by). Only a started call can be resolved;
    running the same resolution again changes nothing.
    """

    async def main() -> object:
        from step_persistence.effects import resolve_tool_effect

        async with open_store(store) as opened:
            found = await resolve_run_id(opened, run_id)
            try:
                return await resolve_tool_effect(
                    opened,
                    run_id=found,
                    tool_call_id=call,
                    status=status,
                    summary=summary,
                    resolved_by='step-persistence runs resolve',
                )
            except LookupError:
                open_calls = [e.tool_call_id for e in await opened.list_unresolved_tool_effects(run_id=found)]
                raise LookupError(
                    f'run {found!r} has no tool call {call!r}; unresolved calls: {", ".join(open_calls) or "none"}'
                ) from None
            except ValueError as error:
                return error

    outcome = run(main)
    if isinstance(outcome, ValueError):
        fail(str(outcome), EXIT_FAILED)
    if json_output:
        print_json(outcome)
        return
    out().print(f'resolved tool call {escape(call)} as {escape(status)}', highlight=False, soft_wrap=True)
