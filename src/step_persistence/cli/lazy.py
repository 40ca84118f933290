"""Command groups whose commands typer builds one at a time, when first named (start-up, issue 18 item 5).

Typer turns every command of an app into a click command before running any: it reads each
function's signature and annotations and builds its options, about 11 ms for the whole command
line, of which a command such as `runs list` needs one. `lazily(app)` stands in for a group's
typer app (`app.add_typer(lazily(runs.app), name='runs')`): its group lists every command of
`app` by name, in `app`'s order, and builds a command, through typer's public `get_command`, only
when it is looked up (to run it, or for help, which looks up every command it lists). What typer
builds is the same command: its options, help and behaviour do not change.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, MutableMapping
from functools import partial
from typing import Any, ClassVar

import typer
import typer.main

from step_persistence.cli._common import Group

__all__ = ['LazyCommands', 'LazyGroup', 'lazily']


def _command_name(info: Any) -> str:
    """The name typer gives a registered command: the one it was given, or its function's, with `-` for `_`."""
    name: str | None = info.name
    return name if name is not None else info.callback.__name__.lower().replace('_', '-')


def _build_command(info: Any) -> Any:
    """The click command typer builds for one registered command (`CommandInfo`), alone."""
    single = typer.Typer(add_completion=False)
    single.registered_commands.append(info)
    return typer.main.get_command(single)


def _build_group(app: typer.Typer) -> Any:
    """The click group of `app` (a group of the command line), its own commands built lazily."""
    return typer.main.get_group(lazily(app))


def _built(command: Any) -> Any:
    return command


class LazyCommands(MutableMapping[str, Any]):
    """A group's commands by name, each built on first lookup; the names, in registration order, known at once."""

    def __init__(self, app: typer.Typer) -> None:
        self._builders: dict[str, Callable[[], Any]] = {}
        for info in app.registered_commands:
            self._builders[_command_name(info)] = partial(_build_command, info)
        for group in app.registered_groups:
            if group.name is None or group.typer_instance is None:
                raise ValueError('every group of the command line is added with a name')
            self._builders[group.name] = partial(_build_group, group.typer_instance)
        self._built: dict[str, Any] = {}

    def __getitem__(self, name: str) -> Any:
        if name not in self._built:
            self._built[name] = self._builders[name]()
        return self._built[name]

    def __setitem__(self, name: str, command: Any) -> None:
        self._builders.setdefault(name, partial(_built, command))
        self._built[name] = command

    def __delitem__(self, name: str) -> None:
        del self._builders[name]
        self._built.pop(name, None)

    def __iter__(self) -> Iterator[str]:
        return iter(self._builders)

    def __len__(self) -> int:
        return len(self._builders)


class LazyGroup(Group):
    """A group whose commands are `source`'s, built when first looked up (`LazyCommands`)."""

    source: ClassVar[typer.Typer]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.commands = LazyCommands(self.source)


def lazily(app: typer.Typer) -> typer.Typer:
    """A typer app standing in for `app` (a group: help, and no arguments showing it, as `app`'s), whose
    click group builds `app`'s commands only when they are looked up."""
    group = type('LazyGroupOfApp', (LazyGroup,), {'source': app})
    return typer.Typer(help=app.info.help, no_args_is_help=app.info.no_args_is_help, cls=group)
