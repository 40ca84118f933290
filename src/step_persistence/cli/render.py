"""Rich renderings of runs, trees and reports for people (commands print JSON for scripts)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from rich.table import Table
from rich.tree import Tree

from step_persistence.records import ContinuableSnapshot, StepEvent, ToolEffectRecord
from step_persistence.reporting import RunSummary, ToolStats
from step_persistence.status import RunNode, RunStatus

__all__ = ['effects_table', 'events_table', 'run_tree', 'snapshots_table', 'summaries_table', 'tool_stats_table']

_STATUS_STYLE: dict[RunStatus, str] = {
    'completed': 'green',
    'failed': 'red',
    'crashed': 'bold red',
    'running': 'yellow',
}


def _when(moment: datetime | None) -> str:
    return '' if moment is None else moment.isoformat(timespec='seconds')


def _status(status: RunStatus) -> str:
    return f'[{_STATUS_STYLE[status]}]{status}[/]'


def summaries_table(summaries: Sequence[RunSummary], *, title: str = 'Runs') -> Table:
    table = Table(title=title)
    for column in ('run', 'agent', 'status', 'started', 'duration', 'model', 'tools', 'failed', 'unresolved'):
        table.add_column(column, overflow='fold')
    for summary in summaries:
        table.add_row(
            summary.run_id,
            summary.agent_name or '',
            _status(summary.status),
            _when(summary.started_at),
            '' if summary.duration_seconds is None else f'{summary.duration_seconds:.1f}s',
            str(summary.model_requests),
            str(summary.tool_calls),
            str(summary.tool_failures),
            str(summary.unresolved_effects),
        )
    return table


def events_table(events: Sequence[StepEvent]) -> Table:
    table = Table(title='Events')
    for column in ('time', 'step', 'kind', 'tool', 'error'):
        table.add_column(column, overflow='fold')
    for event in events:
        tool = '' if event.tool_name is None else f'{event.tool_name} ({event.tool_call_id})'
        table.add_row(_when(event.timestamp), str(event.step_index), event.kind, tool, event.error or '')
    return table


def effects_table(effects: Sequence[ToolEffectRecord]) -> Table:
    table = Table(title='Tool effects')
    for column in ('call', 'tool', 'status', 'started', 'ended', 'idempotency key', 'summary'):
        table.add_column(column, overflow='fold')
    for effect in effects:
        style = 'bold red' if effect.status == 'started' else ''
        table.add_row(
            effect.tool_call_id,
            effect.tool_name,
            f'[{style}]{effect.status}[/]' if style else effect.status,
            _when(effect.started_at),
            _when(effect.ended_at),
            effect.idempotency_key or '',
            effect.effect_summary or '',
        )
    return table


def snapshots_table(snapshots: Sequence[ContinuableSnapshot]) -> Table:
    table = Table(title='Snapshots')
    for column in ('seq', 'step', 'state', 'messages', 'time'):
        table.add_column(column)
    for snapshot in snapshots:
        table.add_row(
            str(snapshot.seq),
            str(snapshot.step_index),
            snapshot.state,
            str(len(snapshot.messages)),
            _when(snapshot.timestamp),
        )
    return table


def run_tree(root: RunNode) -> Tree:
    tree = Tree(_node_label(root))
    _add_children(tree, root)
    return tree


def _node_label(node: RunNode) -> str:
    label = f'{node.record.agent_name or "?"}  {node.record.run_id}  {_status(node.status)}'
    for effect in node.unresolved:
        label += f'\n[bold red]! unresolved {effect.tool_name} ({effect.tool_call_id})[/]'
    return label


def _add_children(branch: Tree, node: RunNode) -> None:
    for child in node.children:
        _add_children(branch.add(_node_label(child)), child)


def tool_stats_table(stats: Sequence[ToolStats]) -> Table:
    table = Table(title='Tools')
    for column in ('tool', 'calls', 'failures', 'unresolved', 'mean', 'max'):
        table.add_column(column)
    for row in stats:
        table.add_row(
            row.tool_name,
            str(row.calls),
            str(row.failures),
            str(row.unresolved),
            '' if row.mean_seconds is None else f'{row.mean_seconds:.3f}s',
            '' if row.max_seconds is None else f'{row.max_seconds:.3f}s',
        )
    return table
