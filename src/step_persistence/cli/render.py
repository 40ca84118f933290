"""Rich renderings of runs, trees and reports for people at a terminal (commands print JSON for scripts).

Every stored string (run ids, agent and tool names, errors, summaries) goes through `escape`
before it reaches markup. A run id is never wrapped or cut: at a terminal too narrow for every
column, a table of many rows (`tables.py`) leaves out its least needed columns (and says which);
in a pipe, lines are as long as they need to be (`_common.out`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, TypeVar

from rich import box
from rich.console import Console, RenderableType
from rich.measure import Measurement
from rich.segment import Segments
from rich.table import Table
from rich.text import Text
from rich.tree import Tree

from step_persistence.cli._common import STATUS_STYLE, escape, when

if TYPE_CHECKING:
    from step_persistence.cli.lineage import Continuation, ConversationRun
    from step_persistence.cli.tables import Column, Columns
    from step_persistence.records import ContinuableSnapshot, RunOrigin, RunRecord, StepEvent, ToolEffectRecord
    from step_persistence.status import RunNode

__all__ = [
    'continuation_text',
    'conversation_tree',
    'effects_table',
    'events_table',
    'fitted_table',
    'origin_text',
    'print_fitted',
    'rich_table',
    'run_tree',
    'snapshots_table',
    'unresolved_table',
]

Row = TypeVar('Row')


def _status(status: str) -> str:
    return f'[{STATUS_STYLE.get(status, "")}]{escape(status)}[/]'


def _table(title: str | None = None, caption: str | None = None) -> Table:
    return Table(
        title=title,
        caption=caption,
        box=box.SIMPLE_HEAD,
        show_edge=False,
        pad_edge=False,
        title_justify='left',
        caption_justify='left',
    )


def _natural_width(console: Console, renderable: RenderableType) -> Measurement:
    """How wide `renderable` is at least and at most, whatever the console's width."""
    return Measurement.get(console, console.options.update_width(100_000), renderable)


def _pinned(table: Table) -> Table:
    """`table` with each unwrapped column at least as wide as its widest cell.

    Rich's measurement counts an unwrapped column by its longest word, so a table that "fits"
    could still be cut down, run ids first, when rendered; pinned, it is measured as it renders.
    """
    for column in table.columns:
        if column.no_wrap:
            cells = [column.header, *column.cells]
            column.min_width = max(
                (Text.from_markup(cell).cell_len if isinstance(cell, str) else 0 for cell in cells), default=0
            )
    return table


def print_fitted(console: Console, renderable: RenderableType) -> None:
    """Print `renderable` no narrower than its narrowest rendering, so no unbreakable cell is cut or folded.

    Wider than the console, the lines are written whole and the terminal wraps them where it must.
    """
    needed = _natural_width(console, renderable).minimum
    if needed <= console.width:
        console.print(renderable)
        return
    console.print(Segments(console.render(renderable, console.options.update_width(needed))), crop=False)


def rich_table(table: Columns[Row], rows: Sequence[Row], *, shown: Sequence[str] | None = None) -> Table:
    """`table`'s rows as a rich table with the `shown` columns (all by default), a caption naming the others."""
    names = [name for name in table.columns if shown is None or name in shown]
    left_out = [name for name in table.columns if name not in names]
    caption = f'not shown at this width: {", ".join(left_out)} (--json has every field)' if left_out else None
    rendered = _table(table.title, caption)
    columns = [table.columns[name] for name in names]
    for column in columns:
        rendered.add_column(column.header, no_wrap=column.no_wrap, overflow='fold', justify=column.justify)
    for row in rows:
        rendered.add_row(*(_cell(column, row) for column in columns))
    return _pinned(rendered)


def _cell(column: Column[Row], row: Row) -> str:
    text = escape(column.cell(row))
    style = None if column.style is None else column.style(row)
    return f'[{style}]{text}[/]' if style else text


def fitted_table(console: Console, table: Columns[Row], rows: Sequence[Row]) -> Table:
    """`rich_table` with as many columns as fit the console without wrapping an unwrapped column."""
    shown = list(table.columns)
    rendered = rich_table(table, rows)
    for name in table.left_out_first:
        if _natural_width(console, rendered).minimum <= console.width:
            break
        shown.remove(name)
        rendered = rich_table(table, rows, shown=shown)
    return rendered


def _tokens(event: StepEvent) -> str:
    """The event's usage as `in/out`, the cached input tokens after it when there are any."""
    usage = event.usage
    if usage is None:
        return ''
    cached = [
        f'{count} {what}'
        for count, what in ((usage.cache_read_tokens, 'cache read'), (usage.cache_write_tokens, 'cache write'))
        if count
    ]
    return f'{usage.input_tokens}/{usage.output_tokens}' + (f' ({", ".join(cached)})' if cached else '')


def events_table(events: Sequence[StepEvent]) -> Table:
    table = _table('Events')
    table.add_column('time', no_wrap=True)
    table.add_column('step', justify='right')
    table.add_column('kind', no_wrap=True)
    table.add_column('tool', overflow='fold')
    table.add_column('model', overflow='fold')
    table.add_column('tokens in/out', justify='right')
    table.add_column('error', overflow='fold')
    for event in events:
        tool = '' if event.tool_name is None else f'{event.tool_name} ({event.tool_call_id})'
        table.add_row(
            when(event.timestamp),
            str(event.step_index),
            escape(event.kind),
            escape(tool),
            escape(event.model_name or ''),
            _tokens(event),
            escape(event.error or ''),
        )
    return _pinned(table)


def _effect_status(effect: ToolEffectRecord) -> str:
    return f'[bold red]{escape(effect.status)}[/]' if effect.status == 'started' else escape(effect.status)


def effects_table(effects: Sequence[ToolEffectRecord]) -> Table:
    table = _table('Tool effects')
    for column in ('call', 'tool', 'status', 'started', 'ended', 'idempotency key', 'summary'):
        table.add_column(column, overflow='fold')
    for effect in effects:
        table.add_row(
            escape(effect.tool_call_id),
            escape(effect.tool_name),
            _effect_status(effect),
            when(effect.started_at),
            when(effect.ended_at),
            escape(effect.idempotency_key or ''),
            escape(effect.effect_summary or ''),
        )
    return _pinned(table)


def unresolved_table(found: Sequence[tuple[str, Sequence[ToolEffectRecord]]]) -> Table:
    """Unresolved effects of several runs, one row each, the run id first and whole."""
    table = _table('Unresolved tool effects')
    table.add_column('run', no_wrap=True)
    for column in ('call', 'tool', 'started', 'idempotency key', 'summary'):
        table.add_column(column, overflow='fold')
    for run_id, effects in found:
        for effect in effects:
            table.add_row(
                escape(run_id),
                escape(effect.tool_call_id),
                escape(effect.tool_name),
                when(effect.started_at),
                escape(effect.idempotency_key or ''),
                escape(effect.effect_summary or ''),
            )
    return _pinned(table)


def snapshots_table(snapshots: Sequence[ContinuableSnapshot]) -> Table:
    table = _table('Snapshots')
    for column in ('seq', 'step', 'state', 'messages', 'time'):
        table.add_column(column, no_wrap=True)
    for snapshot in snapshots:
        table.add_row(
            str(snapshot.seq),
            str(snapshot.step_index),
            escape(snapshot.state),
            str(len(snapshot.messages)),
            when(snapshot.timestamp),
        )
    return _pinned(table)


def origin_text(origin: RunOrigin, *, beside: bool = False) -> str:
    """`continued from RUN #3` (or `forked from ...`); `continued from #3` when the run is `beside` it in a tree."""
    source = '' if beside else f'[bold]{escape(origin.run_id)}[/] '
    return f'{escape(origin.kind)} from {source}#{origin.seq}'


def continuation_text(continuation: Continuation) -> str:
    """`continued by RUN (from #3)`, or `forked by ...`: a run that went on from one of this run's snapshots."""
    return f'{escape(continuation.kind)} by [bold]{escape(continuation.run_id)}[/] (from #{continuation.seq})'


def _run_label(
    record: RunRecord, status: str, unresolved: Sequence[ToolEffectRecord], *, notes: Sequence[str] = ()
) -> str:
    """`agent  RUN  status  notes...`, then a line per unresolved effect."""
    label = '  '.join(
        [f'{escape(record.agent_name or "?")}', f'[bold]{escape(record.run_id)}[/]', _status(status), *notes]
    )
    for effect in unresolved:
        label += f'\n[bold red]! unresolved {escape(effect.tool_name)} ({escape(effect.tool_call_id)})[/]'
    return label


def run_tree(root: RunNode, continuations: Mapping[str, Sequence[Continuation]] | None = None) -> Tree:
    """The delegation tree under `root`, each run with its origin and the runs that went on from it
    (`continuations`, by run id)."""
    went_on = continuations or {}

    def label(node: RunNode) -> str:
        origin = node.record.origin
        text = _run_label(
            node.record, node.status, node.unresolved, notes=[] if origin is None else [origin_text(origin)]
        )
        return text + ''.join(f'\n[dim]{continuation_text(each)}[/]' for each in went_on.get(node.record.run_id, ()))

    tree = Tree(label(root))
    branches = [(tree, root)]
    while branches:
        branch, node = branches.pop()
        branches.extend((branch.add(label(child)), child) for child in node.children)
    return tree


_OUTSIDE: dict[str, str] = {
    'other_conversation': 'in another conversation',
    'not_stored': 'no longer stored',
    'cycle': 'which descends from this run',
}


def conversation_tree(conversation_id: str, runs: Sequence[ConversationRun]) -> Tree:
    """The conversation's runs as a tree of continuations and forks, headed by `conversation_id`.

    A run that continues the one above it at the same level says `continued from #N`, so a chat
    reads down one column. The other runs that went on from a run (forks, or a continuation of an
    older snapshot) hang under it, each starting a column of its own under a `forked from #N`
    (or `continued from #N`) heading. A run whose origin is outside the conversation starts a
    column at the top level, its origin named with a note.
    """
    by_id = {run.record.run_id: run for run in runs}
    count = f'{len(runs)} run' + ('' if len(runs) == 1 else 's')
    tree = Tree(f'Conversation [bold]{escape(conversation_id)}[/]  ({count})')
    columns: deque[tuple[Tree, ConversationRun]] = deque((tree, run) for run in runs if run.parent_id is None)
    while columns:
        branch, first = columns.popleft()
        following: ConversationRun | None = first
        while following is not None:
            member = following
            node = branch.add(_conversation_label(member, first=member is first))
            children = [by_id[child] for child in member.children]
            following = next((child for child in children if _continues(child)), None)
            for child in children:
                if child is not following and child.record.origin is not None:
                    columns.append((node.add(f'[dim]{origin_text(child.record.origin, beside=True)}[/]'), child))
    return tree


def _continues(run: ConversationRun) -> bool:
    return run.record.origin is not None and run.record.origin.kind == 'continued'


def _conversation_label(run: ConversationRun, *, first: bool) -> str:
    """A run's line: its origin as `continued from #N` when it follows a run in its column, named
    with a note when it is outside the conversation, left to the heading when it starts a fork."""
    notes = [f'[dim]{when(run.record.started_at)}[/]']
    origin, outside = run.record.origin, run.origin_outside
    if origin is not None and outside is not None:
        notes.append(f'{origin_text(origin)} [yellow]({_OUTSIDE[outside]})[/]')
    elif origin is not None and not first:
        notes.append(origin_text(origin, beside=True))
    return _run_label(run.record, run.status, run.unresolved, notes=notes)
