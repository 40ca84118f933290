"""The `step-persistence` command: inspect runs, report on them, and manage stores.

Importing this package imports typer and the command modules, which import nothing heavy until a
command runs (see `_common`); typer builds a group's commands only when one is named (`lazy.py`).
"""

from __future__ import annotations

import typer

from step_persistence.cli import conversations, db, runs
from step_persistence.cli._common import (
    DEFAULT_STORE,
    Command,
    Group,
    StoreOption,
    hold_collection,
    resume_collection,
)
from step_persistence.cli.copy import copy
from step_persistence.cli.lazy import lazily
from step_persistence.cli.maintenance import gc, prune
from step_persistence.cli.recover import recover
from step_persistence.cli.report import report
from step_persistence.cli.serve import serve

__all__ = ['app', 'main']

app = typer.Typer(
    help=(
        'Inspect and manage step-persistence stores. Every command but copy takes its store as --store URL, '
        'or from STEP_PERSISTENCE_STORE. '
        'Exit codes: 0 ok, 1 migration refused, runs not copied, effect not resolved or a recovered run failed, '
        '2 usage, 3 not found, 4 unreachable store, 5 database error.'
    ),
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    cls=Group,
)
app.add_typer(lazily(runs.app), name='runs')
app.add_typer(lazily(conversations.app), name='conversations')
app.add_typer(lazily(db.app), name='db')
app.command(cls=Command)(report)
app.command(cls=Command)(copy)
app.command(cls=Command)(prune)
app.command(cls=Command)(gc)
app.command(cls=Command)(serve)
app.command(cls=Command)(recover)


@app.command(cls=Command)
def demo(store: StoreOption = DEFAULT_STORE) -> None:
    """Run the main job end to end: delegation, a crash mid-tool, the run tree, a continuation."""
    from step_persistence.demo import main as demo_main

    resume_collection()
    demo_main(['--store', store])


def main() -> None:
    """Console-script entry point."""
    hold_collection()
    app()
