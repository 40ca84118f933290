"""What every subcommand shares: the store option, running async code, output and errors."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
import sys
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from datetime import datetime, timedelta
from typing import Annotated, Any, NoReturn, TypeVar

import typer
from pydantic import BaseModel
from rich.console import Console
from rich.markup import escape

from step_persistence._urls import redact_text, redact_url
from step_persistence.errors import classify_error, driver_message
from step_persistence.protocol import StepStore
from step_persistence.spec import from_spec

__all__ = [
    'EXIT_DATABASE',
    'EXIT_FAILED',
    'EXIT_NOT_FOUND',
    'EXIT_UNREACHABLE',
    'EXIT_USAGE',
    'JsonOption',
    'StoreOption',
    'console',
    'error_console',
    'fail',
    'open_store',
    'parse_duration',
    'parse_since',
    'print_json',
    'run',
    'warn',
]

T = TypeVar('T')

EXIT_USAGE = 2
"""Bad arguments, including a store URL that names no supported backend."""
EXIT_NOT_FOUND = 3
"""The run (or revision) asked for does not exist."""
EXIT_UNREACHABLE = 4
"""The store's server or file could not be reached or opened."""
EXIT_DATABASE = 5
"""The database refused an operation: locked, a missing table, a statement it rejects."""
EXIT_FAILED = 1
"""The command ran but did not do all it was asked (some runs could not be copied)."""

DEFAULT_STORE = 'sqlite:///runs.db'

StoreOption = Annotated[
    str,
    typer.Option(
        '--store',
        '-s',
        envvar='STEP_PERSISTENCE_STORE',
        help='Store URL: sqlite:///runs.db, postgresql://..., mongodb://.../db, file://path, memory://.',
    ),
]
JsonOption = Annotated[bool, typer.Option('--json', help='Print machine-readable JSON on stdout.')]

console = Console()
error_console = Console(stderr=True)


def fail(message: str, code: int) -> NoReturn:
    """Print `message` on stderr and exit with `code`."""
    error_console.print(f'[bold red]error:[/] {escape(message)}', highlight=False)
    raise typer.Exit(code)


def warn(message: str) -> None:
    """Print a warning on stderr (stdout stays clean for --json)."""
    error_console.print(f'[bold yellow]warning:[/] {escape(message)}', highlight=False)


def _jsonable(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode='json')
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {field.name: _jsonable(getattr(value, field.name)) for field in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(key): _jsonable(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(item) for item in value]
    if isinstance(value, datetime):
        return value.isoformat()
    return value


def print_json(value: Any) -> None:
    """Write `value` (records, dataclasses, lists, dicts) as JSON on stdout."""
    sys.stdout.write(json.dumps(_jsonable(value), indent=2, ensure_ascii=False) + '\n')


_DURATION = re.compile(r'(?P<amount>\d+)\s*(?P<unit>[smhdw])')
_UNITS = {'s': 'seconds', 'm': 'minutes', 'h': 'hours', 'd': 'days', 'w': 'weeks'}


def duration(text: str) -> timedelta | None:
    """A duration such as `90s`, `30m`, `12h`, `7d`, `2w` or `1d12h`; `None` if `text` is not one."""
    compact = text.strip().lower()
    parts = list(_DURATION.finditer(compact))
    if not parts or ''.join(part[0] for part in parts).replace(' ', '') != compact.replace(' ', ''):
        return None
    total = timedelta()
    for part in parts:
        total += timedelta(**{_UNITS[part['unit']]: int(part['amount'])})
    return total


def parse_duration(text: str, option: str) -> timedelta:
    """`option`'s value as a duration, or a usage error naming the accepted forms."""
    parsed = duration(text)
    if parsed is None:
        fail(f'{option} {text!r} is not a duration like 90s, 30m, 12h, 7d or 2w', EXIT_USAGE)
    return parsed


def parse_since(text: str | None) -> datetime | None:
    """`--since`: an ISO-8601 instant, or a duration back from now such as `30m`, `12h`, `7d`."""
    if text is None:
        return None
    back = duration(text)
    if back is not None:
        return datetime.now().astimezone() - back
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        fail(f'--since {text!r} is neither an ISO-8601 instant nor a duration like 12h or 7d', EXIT_USAGE)
    return moment if moment.tzinfo is not None else moment.astimezone()


@asynccontextmanager
async def open_store(url: str) -> AsyncIterator[StepStore]:
    """Open the store at `url`; exit with a clear message if the URL is invalid."""
    try:
        store = from_spec(url)
    except (ValueError, ImportError) as error:
        fail(f'cannot open store {redact_url(url)!r}: {redact_text(str(error))}', EXIT_USAGE)
    async with store:
        yield store


def run(main: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run a command's coroutine, turning lookup, connection and database failures into exit codes."""
    try:
        return asyncio.run(main())
    except LookupError as error:
        fail(str(error).strip('\'"'), EXIT_NOT_FOUND)
    except Exception as error:
        kind = classify_error(error)
        if kind == 'unreachable':
            fail(f'cannot reach the store: {redact_text(str(error))}', EXIT_UNREACHABLE)
        if kind == 'database':
            fail(f'the database refused the operation: {redact_text(driver_message(error))}', EXIT_DATABASE)
        raise
