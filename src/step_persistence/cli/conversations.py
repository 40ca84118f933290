"""`step-persistence conversations ...`: list conversations, show one as a tree of its runs.

A conversation is the runs sharing a `conversation_id` (`store.list_conversations`); `show`
takes the id or a unique prefix of it (`_common.resolve_conversation_id`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from step_persistence.cli._common import (
    DEFAULT_STORE,
    Command,
    Group,
    JsonOption,
    StoreOption,
    open_store,
    out,
    print_json,
    resolve_conversation_id,
    run,
    warn,
)

if TYPE_CHECKING:
    from step_persistence.cli.lineage import ConversationRun
    from step_persistence.records import ConversationSummary

app = typer.Typer(help='Inspect conversations: the runs sharing a conversation id.', no_args_is_help=True, cls=Group)

DEFAULT_LIMIT = 50

ConversationArgument = Annotated[
    str,
    typer.Argument(
        metavar='ID', help='The conversation id, or a prefix of it that no other conversation id starts with.'
    ),
]


@app.command('list', cls=Command)
def list_conversations(
    store: StoreOption = DEFAULT_STORE,
    agent: Annotated[str | None, typer.Option(metavar='NAME', help='Only runs of this agent name count.')] = None,
    limit: Annotated[
        int, typer.Option(metavar='N', min=0, help='Show at most N conversations (0: every one).')
    ] = DEFAULT_LIMIT,
    oldest_first: Annotated[
        bool, typer.Option('--oldest-first/--newest-first', help='Order by the start of their last run.')
    ] = False,
    json_output: JsonOption = False,
) -> None:
    """List conversations, the one with the newest run first: runs, first and last start, head run."""

    async def main() -> list[ConversationSummary]:
        async with open_store(store) as opened:
            return await opened.list_conversations(
                limit=limit + 1 if limit else None, newest_first=not oldest_first, agent_name=agent
            )

    found = run(main)
    shown = found[:limit] if limit else found
    if json_output:
        print_json(shown)
        return
    if not shown:
        print('No conversation matches.' if agent else 'No conversations.')
        return
    from step_persistence.cli.tables import CONVERSATIONS, show

    show(CONVERSATIONS, shown)
    if len(found) > len(shown):
        end = 'oldest' if oldest_first else 'newest'
        warn(f'showing the {end} {limit} conversations (by their last run); --limit N shows more, --limit 0 every one')


@app.command(cls=Command)
def show(
    conversation_id: ConversationArgument, store: StoreOption = DEFAULT_STORE, json_output: JsonOption = False
) -> None:
    """Show a conversation's runs as a tree of continuations and forks, with their statuses.

    A run's continuation follows it at the same level; a fork hangs under the run it forked
    from. A run whose origin is in another conversation, or no longer stored, is at the top
    level with a note. --json lists the runs oldest first, each with the ids of its children.
    """

    async def main() -> tuple[str, list[ConversationRun]]:
        from step_persistence.cli.lineage import load_conversation

        async with open_store(store) as opened:
            found = await resolve_conversation_id(opened, conversation_id)
            runs = await load_conversation(opened, found)
        if not runs:
            raise LookupError(f'conversation {found!r} has no run (deleted meanwhile)')
        return found, runs

    found, runs = run(main)
    if json_output:
        print_json({'conversation_id': found, 'runs': runs})
        return
    from step_persistence.cli.render import conversation_tree, print_fitted

    print_fitted(out(), conversation_tree(found, runs))
