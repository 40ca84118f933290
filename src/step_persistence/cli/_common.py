"""What every subcommand shares: the store option, running async code, output and errors.

Start-up time is part of the interface: this module, and every command module at import, imports
only typer and the standard library. Rich, pydantic, the stores (so pydantic-ai, SQLAlchemy and the
drivers) and Alembic are imported by the command that uses them, when it runs, so `--help` and a
command on one store do not pay for the others (benchmarks/cli_startup.py measures it).
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import json
import re
import sys
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, NoReturn, TypeVar

import typer
from typer.core import TyperCommand, TyperGroup

from step_persistence._urls import redact_text, redact_url, url_scheme

if TYPE_CHECKING:
    from rich.console import Console, RenderableType

    from step_persistence.protocol import StepStore

__all__ = [
    'EXIT_DATABASE',
    'EXIT_FAILED',
    'EXIT_NOT_FOUND',
    'EXIT_UNREACHABLE',
    'EXIT_USAGE',
    'RUN_STATUS_NAMES',
    'STATUS_STYLE',
    'Command',
    'Group',
    'JsonOption',
    'RunArgument',
    'RunStatusName',
    'StoreOption',
    'UsageError',
    'display',
    'escape',
    'fail',
    'hold_collection',
    'json_timestamp',
    'missing_location',
    'open_store',
    'out',
    'parse_duration',
    'parse_since',
    'print_json',
    'resolve_conversation_id',
    'resolve_run_id',
    'resume_collection',
    'run',
    'stderr',
    'visible',
    'warn',
    'when',
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
"""The command ran but did not do all it was asked (some runs could not be copied, an effect not resolved)."""

DEFAULT_STORE = 'sqlite:///runs.db'
STORE_ENV = 'STEP_PERSISTENCE_STORE'
STORE_GIVEN_AS = f'--store (or {STORE_ENV})'
"""Where a command's store URL comes from, as messages name it."""

RunStatusName = Literal['running', 'completed', 'failed', 'crashed']
"""`step_persistence.records.RunStatus`, spelled here so that defining `--status` imports no records
(and so no pydantic-ai); tests/cli/test_cli_startup.py checks that the two agree."""
RUN_STATUS_NAMES: tuple[str, ...] = ('running', 'completed', 'failed', 'crashed')

StoreOption = Annotated[
    str,
    typer.Option(
        '--store',
        '-s',
        envvar=STORE_ENV,
        metavar='URL',
        help=(
            'Store URL: sqlite:///runs.db, postgresql://... (or postgres://; ?schema=NAME for a schema), '
            'mongodb://.../db, file://path, memory://.'
        ),
    ),
]
JsonOption = Annotated[bool, typer.Option('--json', help='Print machine-readable JSON on stdout.')]
RunArgument = Annotated[
    str,
    typer.Argument(metavar='RUN', help='The run id, or a prefix of it that no other run id starts with.'),
]


class _ReadableHelp:
    """Help that reads like a command line's: `RUN`, not `{run_id}`; no `<bool>` after a flag."""

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        pieces: list[str] = super().collect_usage_pieces(ctx)  # type: ignore[misc]
        return [piece[1:-1] if piece.startswith('{') and piece.endswith('}') else piece for piece in pieces]

    def get_params(self, ctx: Any) -> list[Any]:
        params: list[Any] = super().get_params(ctx)  # type: ignore[misc]
        for param in params:
            if getattr(param, 'is_flag', False) and param.metavar is None:
                param.metavar = ''  # typer would show the flag's type, `<bool>`
            elif param.param_type_name == 'argument' and param.metavar is not None:
                param.display_type_rich = _no_type  # `RUN`, not `RUN <str>`
        return params


def _no_type(ctx: Any) -> None:
    return None


class Command(_ReadableHelp, TyperCommand):
    """Every command's class (`app.command(cls=Command)`)."""


class Group(_ReadableHelp, TyperGroup):
    """Every command group's class (`typer.Typer(cls=Group)`)."""


class UsageError(Exception):
    """Raised inside a command's coroutine for a usage error found on the store (an ambiguous run id)."""


@cache
def out() -> Console:
    """The console for stdout: at a terminal, as wide as it is; in a pipe or a file, as wide as a line needs.

    A table written to a pipe is read by `grep` and `cut`, which want each row on one line.
    """
    from rich.console import Console

    return Console(width=None if sys.stdout.isatty() else 100_000)


@cache
def stderr() -> Console:
    """The console for stderr (messages, warnings, progress), which keeps stdout clean for --json."""
    from rich.console import Console

    return Console(stderr=True, width=None if sys.stderr.isatty() else 100_000)


_CONTROL = re.compile('[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]')
"""Characters a terminal would obey rather than show: C0 and C1 controls (escape sequences, bells,
carriage returns) but newline and tab, and the bidirectional overrides that reorder what is shown."""


def _visible(character: re.Match[str]) -> str:
    code = ord(character.group())
    return f'\\x{code:02x}' if code < 0x100 else f'\\u{code:04x}'


def visible(text: str) -> str:
    """`text` with the characters a terminal would obey (`_CONTROL`) shown as `\\xNN` or `\\uNNNN`."""
    return _CONTROL.sub(_visible, text)


def escape(text: str) -> str:
    """`text` made safe to print inside markup: rich markup escaped, control characters shown as `\\xNN`.

    Every stored string goes through it (ids, names, errors and summaries can come from a model).
    """
    from rich.markup import escape as rich_escape

    return rich_escape(visible(text))


def display(renderable: RenderableType) -> None:
    """Print a table or tree on stdout."""
    out().print(renderable)


def fail(message: str, code: int) -> NoReturn:
    """Print `message` on stderr and exit with `code`."""
    stderr().print(f'[bold red]error:[/] {escape(message)}', highlight=False)
    raise typer.Exit(code)


def warn(message: str) -> None:
    """Print a warning on stderr (stdout stays clean for --json)."""
    stderr().print(f'[bold yellow]warning:[/] {escape(message)}', highlight=False)


STATUS_STYLE: dict[str, str] = {
    'completed': 'green',
    'failed': 'red',
    'crashed': 'bold red',
    'running': 'yellow',
}
"""A run status's rich style at a terminal."""


def when(moment: datetime | None) -> str:
    """An instant for people: UTC to the second, `2026-12-01 21:50:50Z`."""
    return '' if moment is None else moment.astimezone(UTC).strftime('%Y-%m-%d %H:%M:%SZ')


def json_timestamp(moment: datetime) -> str:
    """The one spelling of an instant in JSON output: ISO 8601 in UTC with `Z`, as pydantic writes it."""
    if moment.tzinfo is None:
        raise ValueError(f'naive datetime {moment.isoformat()} in JSON output')
    return moment.astimezone(UTC).isoformat().replace('+00:00', 'Z')


def _jsonable(value: Any) -> Any:
    if isinstance(value, datetime):
        return json_timestamp(value)
    if isinstance(value, dict):
        return {str(key): _jsonable(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(item) for item in value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {field.name: _jsonable(getattr(value, field.name)) for field in dataclasses.fields(value)}
    model_dump = getattr(value, 'model_dump', None)
    if callable(model_dump):  # a record: its fields as Python values, so that timestamps go through json_timestamp
        return _jsonable(model_dump())
    return value


def print_json(value: Any) -> None:
    """Write `value` (records, dataclasses, lists, dicts) as JSON on stdout; instants as `json_timestamp`."""
    sys.stdout.write(json.dumps(_jsonable(value), indent=2, ensure_ascii=False, default=str) + '\n')


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


def hold_collection() -> None:
    """Collect no cyclic garbage while the command starts (the console script's first step), until
    `resume_collection`: when its store or database is open (`open_store`, the `db` commands), or its
    work begins (`demo`); help and usage errors end without collecting."""
    gc.disable()


def resume_collection() -> None:
    """Collect garbage again, among the objects made from now on.

    What start-up made (modules, classes, validators, the schema, the open store) lives until the
    process exits, so it is frozen (`gc.freeze`) rather than walked again by each collection: the
    full collections that imports set off would otherwise cost about 50 ms of a `runs list`
    (benchmarks/cli_startup.py). Only after `hold_collection`: a process that imports this module
    for another reason (a test) keeps its collector as it is.
    """
    if gc.isenabled():
        return
    gc.freeze()
    gc.enable()


@asynccontextmanager
async def open_store(url: str, *, create: bool = False, given_as: str = STORE_GIVEN_AS) -> AsyncIterator[StepStore]:
    """Open the store at `url`; exit with a clear message if the URL is invalid.

    Reading never writes: unless `create` (the destination of `copy`, which may be created or
    upgraded like any write), the store must exist. A SQLite file or a file store's directory
    that does not exist, or a SQL database without the store's tables, is refused with
    `EXIT_UNREACHABLE` before anything is read, and tables at an older revision with
    `EXIT_DATABASE` and the upgrade to run; nothing is created or migrated. `given_as`: where the
    URL came from, for the messages.
    """
    from step_persistence.spec import from_spec, local_path

    try:
        store = from_spec(url)
        location = local_path(url)
    except (ValueError, ImportError) as error:
        fail(f'cannot open store {redact_url(url)!r}: {redact_text(str(error))}', EXIT_USAGE)
    if not create and location is not None and not location.exists():
        fail(missing_location(url, location, given_as), EXIT_UNREACHABLE)
    async with store:
        sql = sys.modules.get('step_persistence.stores.sql.database_store')
        if sql is not None and isinstance(store, sql.DatabaseStore):
            if create:
                await store.ready_database(write=True)
            else:
                await _require_schema(store, url, given_as)
        resume_collection()
        yield store


def missing_location(url: str, location: Path, given_as: str = STORE_GIVEN_AS) -> str:
    """Why a store whose file or directory does not exist is refused, naming the path."""
    shown = str(location) if location.is_absolute() else f'{location} (in {Path.cwd()})'
    if url_scheme(url) == 'file':
        return (
            f'no file store at {shown}: the directory does not exist; check {given_as}, '
            'or let a write create it (a run, or `copy` to it)'
        )
    return (
        f'no SQLite database at {shown}: the file does not exist; check {given_as}, '
        f'or create it with `step-persistence db upgrade --store {redact_url(url)}`'
    )


async def _require_schema(store: Any, url: str, given_as: str) -> None:
    """Exit unless the SQL store's tables are there at the newest revision (one query; nothing is created)."""
    from step_persistence.stores.sql.database_store import SchemaNotReadyError

    try:
        ready = await store.has_schema()
    except SchemaNotReadyError as error:
        fail(_schema_message(error, url), EXIT_DATABASE)
    if not ready:
        fail(
            f'{redact_url(url)} holds no step-persistence tables (nothing was stored there): check {given_as}, '
            f'or create them with `step-persistence db upgrade --store {redact_url(url)}`',
            EXIT_UNREACHABLE,
        )


def _schema_message(error: Any, url: str | None) -> str:
    """A `SchemaNotReadyError` as the command line says it: the `db upgrade` to run, for this store."""
    if not error.upgradable:
        return str(error)
    where = '' if url is None else f' --store {redact_url(url)}'
    return f'{error.problem}: run `step-persistence db upgrade{where}`, then run this command again'


CANDIDATES_SHOWN = 10
"""How many matching ids an ambiguous prefix lists."""


async def resolve_run_id(store: StepStore, given: str) -> str:
    """The id of the run `given` names: the run with exactly that id, else the one run whose id starts with it.

    Raises `LookupError` (not found, 3) when no run matches, and `UsageError` (2) listing the
    candidates when several do. An exact id costs one read; a prefix, one listing of the runs that
    start with it.
    """
    if await store.get_run(run_id=given) is not None:
        return given
    return _unique_prefix(given, [record.run_id for record in await store.list_runs(run_id_prefix=given)], 'run')


async def resolve_conversation_id(store: StepStore, given: str) -> str:
    """The id of the conversation `given` names: exactly that one when a run has it, else the one
    conversation whose id starts with it.

    Errors as `resolve_run_id`. An exact id costs one indexed read of one run; a prefix, one
    listing of the conversations.
    """
    if await store.list_runs(conversation_id=given, limit=1):
        return given
    summaries = await store.list_conversations(newest_first=False)
    return _unique_prefix(given, [summary.conversation_id for summary in summaries], 'conversation')


def _unique_prefix(given: str, ids: Sequence[str], kind: str) -> str:
    """The one of `ids` that starts with `given`, or the error for none (`LookupError`) or several (`UsageError`)."""
    matches = [each for each in ids if each.startswith(given)]
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise LookupError(f'{kind} {given!r} does not exist (no {kind} id is or starts with it)')
    shown = ', '.join(matches[:CANDIDATES_SHOWN])
    more = len(matches) - CANDIDATES_SHOWN
    listing = f'{len(matches)} {kind} ids start with it: {shown}' + (f' and {more} more' if more > 0 else '')
    raise UsageError(f'{kind} id prefix {given!r} is ambiguous: {listing}')


def run(main: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run a command's coroutine, turning lookup, connection and database failures into exit codes."""
    from step_persistence.errors import classify_error, driver_message

    try:
        return asyncio.run(main())
    except LookupError as error:
        fail(str(error).strip('\'"'), EXIT_NOT_FOUND)
    except UsageError as error:
        fail(str(error), EXIT_USAGE)
    except Exception as error:
        schema = sys.modules.get('step_persistence.stores.sql.database_store')
        if schema is not None and isinstance(error, schema.SchemaNotReadyError):
            fail(_schema_message(error, None), EXIT_DATABASE)
        kind = classify_error(error)
        if kind == 'unreachable':
            fail(f'cannot reach the store: {redact_text(str(error))}', EXIT_UNREACHABLE)
        if kind == 'database':
            fail(f'the database refused the operation: {redact_text(driver_message(error))}', EXIT_DATABASE)
        raise
