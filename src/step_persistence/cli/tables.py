"""The tables of many rows (runs, conversations, tools), declared once and shown two ways.

At a terminal, `show` hands a table to rich (`render.py`: colour, and as many columns as fit the
terminal). Written anywhere else (a pipe, a file), a table is plain text, one line per row, every
column shown, laid out as rich lays it out there, and rich is not imported: `runs list`, `report`
and `conversations list` then start as fast as their store allows (benchmarks/cli_startup.py).

Every cell is the stored text, unescaped; each rendering shows it safely: rich escapes markup and
control characters, the plain text control characters (newlines and tabs too, so that a row stays
on one line).
"""

from __future__ import annotations

import sys
import unicodedata
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic, Literal, TypeVar

from step_persistence.cli._common import STATUS_STYLE, visible, when

if TYPE_CHECKING:
    from step_persistence.records import ConversationSummary
    from step_persistence.reporting import RunSummary, ToolStats

__all__ = ['CONVERSATIONS', 'RUNS', 'TOOLS', 'Column', 'Columns', 'plain_lines', 'show']

Row = TypeVar('Row')

_GAP = '   '
"""Between two columns: rich's padding on either side of a `SIMPLE_HEAD` table's blank column rule."""

_RULE = '─'


@dataclass(frozen=True)
class Column(Generic[Row]):
    header: str
    cell: Callable[[Row], str]
    """The row's text in this column, as stored (unescaped)."""
    no_wrap: bool = True
    """At a terminal, never wrapped (an id); otherwise folded when the table needs the room."""
    justify: Literal['left', 'right'] = 'left'
    style: Callable[[Row], str] | None = None
    """The rich style of the row's cell at a terminal (`None`: none)."""


@dataclass(frozen=True)
class Columns(Generic[Row]):
    """A table's title and columns, in the order shown, and which to leave out first at a narrow terminal."""

    title: str | None
    columns: dict[str, Column[Row]]
    left_out_first: tuple[str, ...] = ()
    """Left out in this order until the table fits a terminal; a column not named here is always shown."""


def _width(text: str) -> int:
    """How many terminal cells `text` takes: two for a wide character, none for a combining one."""
    if text.isascii():
        return len(text)
    return sum(
        0 if unicodedata.combining(character) else 2 if unicodedata.east_asian_width(character) in 'WF' else 1
        for character in text
    )


def _one_line(text: str) -> str:
    """`text` with every character a terminal would obey, and every line break and tab, shown as `\\xNN`."""
    return visible(text).replace('\n', '\\x0a').replace('\t', '\\x09')


def plain_lines(table: Columns[Row], rows: Sequence[Row]) -> list[str]:
    """The table as plain text lines: its title, the headers, a rule, then one line per row, every column."""
    columns = list(table.columns.values())
    body = [[_one_line(column.cell(row)) for column in columns] for row in rows]
    cells = [[column.header for column in columns], *body]
    widths = [max(_width(line[index]) for line in cells) for index in range(len(columns))]

    def line(texts: list[str]) -> str:
        padded = [
            ' ' * (width - _width(text)) + text if column.justify == 'right' else text + ' ' * (width - _width(text))
            for column, text, width in zip(columns, texts, widths, strict=True)
        ]
        return _GAP.join(padded).rstrip()

    rule = _RULE * (sum(widths) + len(_GAP) * (len(widths) - 1))
    title = [] if table.title is None else [table.title]
    return [*title, line(cells[0]), rule, *(line(texts) for texts in body)]


def show(table: Columns[Row], rows: Sequence[Row]) -> None:
    """Print the table on stdout: through rich at a terminal, as `plain_lines` anywhere else."""
    if sys.stdout.isatty():
        from step_persistence.cli._common import out
        from step_persistence.cli.render import fitted_table, print_fitted

        print_fitted(out(), fitted_table(out(), table, rows))
        return
    sys.stdout.write(''.join(f'{line}\n' for line in plain_lines(table, rows)))


def _seconds(value: float | None) -> str:
    return '' if value is None else f'{value:.1f}s'


RUNS: Columns[RunSummary] = Columns(
    'Runs',
    {
        'run': Column('run', lambda s: s.run_id),
        'status': Column('status', lambda s: s.status, style=lambda s: STATUS_STYLE.get(s.status, '')),
        'started': Column('started', lambda s: when(s.started_at)),
        'agent': Column('agent', lambda s: s.agent_name or '', no_wrap=False),
        'duration': Column('duration', lambda s: _seconds(s.duration_seconds), justify='right'),
        'model': Column('model', lambda s: str(s.model_requests), justify='right'),
        'tokens': Column('tokens in/out', lambda s: f'{s.input_tokens}/{s.output_tokens}', justify='right'),
        'tools': Column('tools', lambda s: str(s.tool_calls), justify='right'),
        'failed': Column('failed', lambda s: str(s.tool_failures), justify='right'),
        'unresolved': Column('unresolved', lambda s: str(s.unresolved_effects), justify='right'),
    },
    left_out_first=('tokens', 'duration', 'model', 'failed', 'tools', 'agent', 'unresolved', 'started'),
)
"""The runs table; at a narrow terminal never without the run or its status."""

CONVERSATIONS: Columns[ConversationSummary] = Columns(
    'Conversations',
    {
        'conversation': Column('conversation', lambda c: c.conversation_id),
        'runs': Column('runs', lambda c: str(c.run_count), justify='right'),
        'first started': Column('first started', lambda c: when(c.first_started_at)),
        'last started': Column('last started', lambda c: when(c.last_started_at)),
        'head run': Column('head run', lambda c: c.head_run_id),
    },
    left_out_first=('first started', 'runs', 'last started'),
)
"""The conversations table; at a narrow terminal never without the conversation or its head run."""


def _mean_or_max(value: float | None) -> str:
    return '' if value is None else f'{value:.3f}s'


TOOLS: Columns[ToolStats] = Columns(
    'Tools',
    {
        'tool': Column('tool', lambda t: t.tool_name, no_wrap=False),
        'calls': Column('calls', lambda t: str(t.calls), justify='right'),
        'failures': Column('failures', lambda t: str(t.failures), justify='right'),
        'unresolved': Column('unresolved', lambda t: str(t.unresolved), justify='right'),
        'mean': Column('mean', lambda t: _mean_or_max(t.mean_seconds), justify='right'),
        'max': Column('max', lambda t: _mean_or_max(t.max_seconds), justify='right'),
    },
)
"""The per-tool statistics of `report`."""
