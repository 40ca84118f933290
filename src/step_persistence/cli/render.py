"""Rich renderings of runs, trees and reports for people (commands print JSON for scripts).

Every stored string (run ids, agent and tool names, errors, summaries) goes through `escape`
before it reaches markup. A run id is never wrapped or cut: at a terminal too narrow for every
column, the runs table leaves out its least needed columns (and says which); in a pipe, lines are
as long as they need to be (`_common.out`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from rich import box
from rich.console import Console, RenderableType
from rich.measure import Measurement
from rich.segment import Segments
from rich.table import Table
from rich.text import Text
from rich.tree import Tree

from step_persistence.cli._common import escape

if TYPE_CHECKING:
    from step_persistence.records import ContinuableSnapshot, StepEvent, ToolEffectRecord
    from step_persistence.reporting import RunSummary, ToolStats
    from step_persistence.status import RunNode

__all__ = [
    'effects_table',
    'events_table',
    'fitted',
    'print_fitted',
    'run_tree',
    'snapshots_table',
    'summaries_table',
    'tool_stats_table',
    'unresolved_table',
]

_STATUS_STYLE: dict[str, str] = {
    'completed': 'green',
    'failed': 'red',
    'crashed': 'bold red',
    'running': 'yellow',
}


def when(moment: datetime | None) -> str:
    """An instant for people: UTC to the second, `2026-12-01 21:50:50Z`."""
    return '' if moment is None else moment.astimezone(UTC).strftime('%Y-%m-%d %H:%M:%SZ')


def _status(status: str) -> str:
    return f'[{_STATUS_STYLE.get(status, "")}]{escape(status)}[/]'


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


@dataclass(frozen=True)
class _Column:
    header: str
    cell: Callable[[RunSummary], str]
    no_wrap: bool = True
    justify: str = 'left'


def _seconds(value: float | None) -> str:
    return '' if value is None else f'{value:.1f}s'


_RUN_COLUMNS: dict[str, _Column] = {
    'run': _Column('run', lambda s: escape(s.run_id)),
    'status': _Column('status', lambda s: _status(s.status)),
    'started': _Column('started', lambda s: when(s.started_at)),
    'agent': _Column('agent', lambda s: escape(s.agent_name or ''), no_wrap=False),
    'unresolved': _Column('unresolved', lambda s: str(s.unresolved_effects), justify='right'),
    'tools': _Column('tools', lambda s: str(s.tool_calls), justify='right'),
    'failed': _Column('failed', lambda s: str(s.tool_failures), justify='right'),
    'model': _Column('model', lambda s: str(s.model_requests), justify='right'),
    'duration': _Column('duration', lambda s: _seconds(s.duration_seconds), justify='right'),
}
_SHOWN_ORDER = ('run', 'status', 'started', 'agent', 'duration', 'model', 'tools', 'failed', 'unresolved')
_LEFT_OUT_FIRST = ('duration', 'model', 'failed', 'tools', 'agent', 'unresolved', 'started')
"""At a narrow terminal the runs table leaves these out, in this order, until it fits; never the run or status."""


def summaries_table(
    summaries: Sequence[RunSummary], *, title: str | None = 'Runs', columns: Sequence[str] = ()
) -> Table:
    """The runs as a table with `columns` (all of them by default), in the usual order."""
    shown = [name for name in _SHOWN_ORDER if not columns or name in columns]
    left_out = [name for name in _SHOWN_ORDER if name not in shown]
    caption = f'not shown at this width: {", ".join(left_out)} (--json has every field)' if left_out else None
    table = _table(title, caption)
    for name in shown:
        column = _RUN_COLUMNS[name]
        table.add_column(column.header, no_wrap=column.no_wrap, overflow='fold', justify=column.justify)  # type: ignore[arg-type]
    for summary in summaries:
        table.add_row(*(_RUN_COLUMNS[name].cell(summary) for name in shown))
    return _pinned(table)


def fitted(console: Console, summaries: Sequence[RunSummary], *, title: str | None = 'Runs') -> Table:
    """`summaries_table` with as many columns as fit the console without wrapping a run id."""
    columns = list(_SHOWN_ORDER)
    table = summaries_table(summaries, title=title)
    for name in _LEFT_OUT_FIRST:
        if _natural_width(console, table).minimum <= console.width:
            break
        columns.remove(name)
        table = summaries_table(summaries, title=title, columns=columns)
    return _pinned(table)


def events_table(events: Sequence[StepEvent]) -> Table:
    table = _table('Events')
    table.add_column('time', no_wrap=True)
    table.add_column('step', justify='right')
    table.add_column('kind', no_wrap=True)
    table.add_column('tool', overflow='fold')
    table.add_column('error', overflow='fold')
    for event in events:
        tool = '' if event.tool_name is None else f'{event.tool_name} ({event.tool_call_id})'
        table.add_row(
            when(event.timestamp), str(event.step_index), escape(event.kind), escape(tool), escape(event.error or '')
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


def run_tree(root: RunNode) -> Tree:
    tree = Tree(_node_label(root))
    _add_children(tree, root)
    return tree


def _node_label(node: RunNode) -> str:
    label = f'{escape(node.record.agent_name or "?")}  [bold]{escape(node.record.run_id)}[/]  {_status(node.status)}'
    for effect in node.unresolved:
        label += f'\n[bold red]! unresolved {escape(effect.tool_name)} ({escape(effect.tool_call_id)})[/]'
    return label


def _add_children(branch: Tree, node: RunNode) -> None:
    for child in node.children:
        _add_children(branch.add(_node_label(child)), child)


def tool_stats_table(stats: Sequence[ToolStats]) -> Table:
    table = _table('Tools')
    table.add_column('tool', overflow='fold')
    for column in ('calls', 'failures', 'unresolved', 'mean', 'max'):
        table.add_column(column, justify='right', no_wrap=True)
    for row in stats:
        table.add_row(
            escape(row.tool_name),
            str(row.calls),
            str(row.failures),
            str(row.unresolved),
            '' if row.mean_seconds is None else f'{row.mean_seconds:.3f}s',
            '' if row.max_seconds is None else f'{row.max_seconds:.3f}s',
        )
    return _pinned(table)
