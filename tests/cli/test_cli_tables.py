"""Tables of many rows outside a terminal (`cli/tables.py`): rich's layout, without rich, one line per row."""

from __future__ import annotations

import io

from rich.console import Console

from step_persistence.cli.render import rich_table
from step_persistence.cli.tables import Column, Columns, plain_lines

THINGS: Columns[tuple[str, str]] = Columns(
    'Things',
    {
        'name': Column('name', lambda row: row[0]),
        'note': Column('note', lambda row: row[1], no_wrap=False),
        'count': Column('count', lambda row: str(len(row[1])), justify='right'),
    },
)


def test_plain_text_is_laid_out_as_rich_lays_it_out_in_a_pipe() -> None:
    rows = [('東京', 'wide'), ('e\u0301', 'a combining accent'), ('[bold]x[/]', 'markup is text'), ('', '')]
    console = Console(file=io.StringIO(), width=100_000, color_system=None)
    console.print(rich_table(THINGS, rows))
    rendered = console.file.getvalue()  # type: ignore[attr-defined]

    assert plain_lines(THINGS, rows) == [line.rstrip() for line in rendered.splitlines()]


def test_a_row_stays_on_one_line() -> None:
    lines = plain_lines(THINGS, [('two\nlines', 'a\ttab \x1b[31mred')])

    assert lines == [
        'Things',
        'name' + ' ' * 11 + 'note' + ' ' * 19 + 'count',
        '─' * 43,
        'two\\x0alines   a\\x09tab \\x1b[31mred' + ' ' * 6 + '14',
    ]
