"""The `step-persistence` command: inspect runs, report on them, and manage stores."""

from __future__ import annotations

from typing import Annotated

import typer

from step_persistence.cli import db, runs
from step_persistence.cli._common import DEFAULT_STORE
from step_persistence.cli.copy import copy
from step_persistence.cli.maintenance import gc, prune
from step_persistence.cli.report import report

__all__ = ['app', 'main']

app = typer.Typer(
    help=(
        'Inspect and manage step-persistence stores. '
        'Exit codes: 0 ok, 1 migration refused or runs not copied, 2 usage, 3 not found, '
        '4 unreachable store, 5 database error.'
    ),
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
app.add_typer(runs.app, name='runs')
app.add_typer(db.app, name='db')
app.command()(report)
app.command()(copy)
app.command()(prune)
app.command()(gc)


@app.command()
def demo(store: Annotated[str, typer.Option('--store', '-s', help='Store URL for the demo.')] = DEFAULT_STORE) -> None:
    """Run the main job end to end: delegation, a crash mid-tool, the run tree, a continuation."""
    from step_persistence.demo import main as demo_main

    demo_main(['--store', store])


def main() -> None:
    """Console-script entry point."""
    app()
