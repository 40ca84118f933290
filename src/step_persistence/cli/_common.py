"""What every subcommand shares: the store option, running async code, output and errors."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import sys
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from datetime import datetime, timedelta
from typing import Annotated, Any, NoReturn, TypeVar

import typer
from pydantic import BaseModel
from rich.console import Console

from step_persistence.protocol import StepStore
from step_persistence.spec import from_spec, redact_url

__all__ = [
    'EXIT_NOT_FOUND',
    'EXIT_UNREACHABLE',
    'EXIT_USAGE',
    'JsonOption',
    'StoreOption',
    'console',
    'fail',
    'open_store',
    'parse_since',
    'print_json',
    'run',
]

T = TypeVar('T')

EXIT_USAGE = 2
"""Bad arguments, including a store URL that names no supported backend."""
EXIT_NOT_FOUND = 3
"""The run (or revision) asked for does not exist."""
EXIT_UNREACHABLE = 4
"""The store's server or file could not be reached or opened."""

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
    error_console.print(f'[bold red]error:[/] {message}', highlight=False)
    raise typer.Exit(code)


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


def parse_since(text: str | None) -> datetime | None:
    """`--since`: an ISO-8601 instant, or a duration back from now such as `30m`, `12h`, `7d`."""
    if text is None:
        return None
    units = {'s': 'seconds', 'm': 'minutes', 'h': 'hours', 'd': 'days', 'w': 'weeks'}
    if text[:-1].isdigit() and text[-1:] in units:
        return datetime.now().astimezone() - timedelta(**{units[text[-1]]: int(text[:-1])})
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
        fail(f'cannot open store {redact_url(url)!r}: {error}', EXIT_USAGE)
    async with store:
        yield store


def run(main: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run a command's coroutine, turning lookup and connection failures into exit codes."""
    try:
        return asyncio.run(main())
    except LookupError as error:
        fail(str(error).strip('\'"'), EXIT_NOT_FOUND)
    except (OSError, TimeoutError, ConnectionError) as error:
        fail(f'cannot reach the store: {redact_url(str(error))}', EXIT_UNREACHABLE)
    except Exception as error:
        if _is_connection_error(error):
            fail(f'cannot reach the store: {redact_url(str(error))}', EXIT_UNREACHABLE)
        raise


def _is_connection_error(error: BaseException) -> bool:
    """Driver errors that mean the server is unreachable (checked by name: drivers are optional)."""
    names = {type(cause).__name__ for cause in _causes(error)}
    return bool(names & {'OperationalError', 'ServerSelectionTimeoutError', 'ConnectionFailure', 'InterfaceError'})


def _causes(error: BaseException) -> list[BaseException]:
    chain: list[BaseException] = []
    current: BaseException | None = error
    while current is not None and current not in chain:
        chain.append(current)
        current = current.__cause__ or current.__context__
    return chain
