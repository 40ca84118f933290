"""`step-persistence db ...`: upgrade, downgrade, inspect and stamp the schema of a SQL store.

Alembic driven from code with the migrations inside the installed package, for deployments that
have no `alembic.ini` or repository checkout. Every command prints the revision the database is
at afterwards, except `db adopt`, which converts a database pydantic-ai-harness wrote.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Annotated

import typer

from step_persistence._urls import redact_text, redact_url, url_scheme
from step_persistence.cli._common import (
    DEFAULT_STORE,
    EXIT_FAILED,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
    Command,
    Group,
    JsonOption,
    StoreOption,
    escape,
    fail,
    missing_location,
    out,
    print_json,
    resume_collection,
    run,
)

if TYPE_CHECKING:
    from step_persistence.adoption.in_place import AdoptionPlan
    from step_persistence.stores.sql.database import Database

app = typer.Typer(
    help='Manage the schema of a SQL store (sqlite://, postgresql://) with the migrations shipped in the package.',
    no_args_is_help=True,
    cls=Group,
)

SchemaOption = Annotated[
    str | None,
    typer.Option(
        '--schema',
        metavar='NAME',
        help='PostgreSQL schema holding the tables and views (created if missing); or ?schema=NAME in the URL.',
    ),
]
ReadSchemaOption = Annotated[
    str | None,
    typer.Option(
        '--schema', metavar='NAME', help='PostgreSQL schema holding the tables and views; or ?schema=NAME in the URL.'
    ),
]
"""`db current` reads the revision and creates nothing, not even the schema."""

_SQL_SCHEMES = ('sqlite', 'postgresql', 'postgres')

EXIT_MIGRATION_FAILED = 1
"""The database refused a migration's statement; the migration's transaction was rolled back."""

Action = Callable[['Database'], Awaitable[None]]


def _database(url: str, schema: str | None, *, create: bool) -> Database:
    """The database at `url`, or a usage error for a URL that names no SQL store.

    Only `db upgrade` (`create`) may create a SQLite file: the other commands refuse one that does
    not exist (exit 4), as every read does.
    """
    from step_persistence.spec import sql_location
    from step_persistence.stores.sql.database import Database

    scheme = url_scheme(url)
    if scheme not in _SQL_SCHEMES:
        fail(
            f'db commands manage the schema of SQL stores (sqlite:///runs.db, postgresql://...); '
            f'{redact_url(url)!r} is not one',
            EXIT_USAGE,
        )
    if schema is not None and scheme == 'sqlite':
        fail('--schema applies to PostgreSQL stores only', EXIT_USAGE)
    try:
        target, named = sql_location(url)
        in_url = named.get('schema')
        if in_url is not None and scheme == 'sqlite':
            fail('?schema= applies to PostgreSQL stores only', EXIT_USAGE)
        if in_url is not None and schema not in (None, in_url):
            fail(f'two schemas given: {in_url!r} in the URL and {schema!r} with --schema', EXIT_USAGE)
        schema = schema or in_url
        database = Database.from_url(target, schema=schema, table_prefix=named.get('table_prefix', ''))
    except (ValueError, ImportError) as error:
        fail(f'cannot open store {redact_url(url)!r}: {redact_text(str(error))}', EXIT_USAGE)
    if database.sqlite_file is not None and not database.sqlite_file.exists():
        if not create:
            run(database.aclose)
            fail(missing_location(url, database.sqlite_file), EXIT_UNREACHABLE)
        database.sqlite_file.parent.mkdir(parents=True, exist_ok=True)  # the revision is read before upgrading
    resume_collection()
    return database


async def _attempt(action: Action, database: Database) -> tuple[str, int] | None:
    """Run a migration; its failure as a message and exit code (raised inside `run()`, an exit would
    be mistaken for an unreachable database by the driver error it carries).

    An unknown revision raises `LookupError` (not found, 3); a revision Alembic refuses is a usage
    error (2); a statement the database refuses fails the command (1).
    """
    from alembic.script.revision import ResolutionError
    from alembic.util import CommandError
    from sqlalchemy.exc import DBAPIError

    try:
        await action(database)
    except CommandError as error:
        if isinstance(error.__cause__, ResolutionError):
            raise LookupError(f'unknown revision ({error})') from error
        return str(error), EXIT_USAGE
    except DBAPIError as error:
        return f'the migration failed and was rolled back: {error.orig}', EXIT_MIGRATION_FAILED
    return None


def _apply(url: str, schema: str | None, json_output: bool, action: Action | None, *, create: bool = False) -> None:
    """Run `action` on the database (if any), then print the revision it is at; only with `create` (an
    upgrade) may a SQLite file be created."""
    from step_persistence.stores.sql import migrate

    database = _database(url, schema, create=create)

    async def main() -> tuple[str | None, tuple[str, int] | None]:
        try:
            # Reading the revision first tells an unreachable database from a failing migration.
            revision = await migrate.current(database)
            failure = None if action is None else await _attempt(action, database)
            if action is not None and failure is None:
                revision = await migrate.current(database)
            return revision, failure
        finally:
            await database.aclose()

    revision, failure = run(main)
    if failure is not None:
        fail(*failure)
    head = migrate.head_revision()
    if json_output:
        print_json({'revision': revision, 'head': head})
    elif revision is None:
        out().print(f'no revision (empty database); the newest is {escape(str(head))}', highlight=False)
    else:
        newest = ' (head)' if revision == head else f'; the newest is {escape(str(head))}'
        out().print(f'at revision {escape(revision)}{newest}', highlight=False)  # a revision is read from the database


@app.command(cls=Command)
def upgrade(
    revision: Annotated[str, typer.Argument(metavar='REV', help='Target revision; the newest by default.')] = 'head',
    store: StoreOption = DEFAULT_STORE,
    schema: SchemaOption = None,
    json_output: JsonOption = False,
) -> None:
    """Create or upgrade the schema (tables and reporting views) to REVISION."""
    from step_persistence.stores.sql import migrate

    _apply(store, schema, json_output, lambda database: migrate.upgrade(database, revision), create=True)


@app.command(cls=Command)
def downgrade(
    revision: Annotated[
        str, typer.Argument(metavar='REV', help="Target revision; 'base' removes every table and view.")
    ],
    store: StoreOption = DEFAULT_STORE,
    schema: SchemaOption = None,
    json_output: JsonOption = False,
) -> None:
    """Downgrade the schema to REVISION (data in removed tables and columns is lost)."""
    from step_persistence.stores.sql import migrate

    _apply(store, schema, json_output, lambda database: migrate.downgrade(database, revision))


@app.command(cls=Command)
def current(
    store: StoreOption = DEFAULT_STORE, schema: ReadSchemaOption = None, json_output: JsonOption = False
) -> None:
    """Print the revision the database is at, and the newest one."""
    _apply(store, schema, json_output, None)


@app.command(cls=Command)
def stamp(
    revision: Annotated[str, typer.Argument(metavar='REV', help="Revision to record; 'base' clears the record.")],
    store: StoreOption = DEFAULT_STORE,
    schema: SchemaOption = None,
    json_output: JsonOption = False,
) -> None:
    """Record REVISION as applied without running any migration (for a schema made by other means)."""
    from step_persistence.stores.sql import migrate

    _apply(store, schema, json_output, lambda database: migrate.stamp(database, revision))


@app.command(cls=Command)
def adopt(
    store: StoreOption = DEFAULT_STORE,
    table: Annotated[
        str,
        typer.Option(
            '--table', metavar='NAME', help="PostgreSQL: the harness store's table= (the start of its table names)."
        ),
    ] = 'step_persistence',
    dry_run: Annotated[bool, typer.Option('--dry-run', help='Print what would be done; change nothing.')] = False,
    json_output: JsonOption = False,
) -> None:
    """Convert the tables pydantic-ai-harness wrote in the SQLite or PostgreSQL database --store into ours, in place.

    One transaction: SQLite's harness tables are renamed harness_<name> (ours have their names),
    our tables are created or upgraded (the revision is recorded), then every harness run not yet
    in them is copied with its events, effects, snapshots and media, and checked. The harness's
    tables are kept. Running it again converts only runs written since: nothing, usually.
    """
    from step_persistence.spec import local_path

    url = store
    if url_scheme(url) not in _SQL_SCHEMES:
        fail(f'db adopt converts a SQLite or PostgreSQL database; {redact_url(url)!r} is not one', EXIT_USAGE)
    try:
        location = local_path(url)
    except ValueError as error:
        fail(f'cannot open store {redact_url(url)!r}: {redact_text(str(error))}', EXIT_USAGE)
    if location is not None and not location.exists():
        fail(missing_location(url, location), EXIT_UNREACHABLE)

    async def main() -> AdoptionPlan | str:
        from step_persistence.adoption.in_place import AdoptionError, adopt, plan_adoption

        resume_collection()
        try:
            return await (plan_adoption(url, table=table) if dry_run else adopt(url, table=table))
        except LookupError:
            raise  # no harness tables: not found (3)
        except AdoptionError as error:
            return str(error)

    plan = run(main)
    if isinstance(plan, str):
        fail(plan, EXIT_FAILED)
    if json_output:
        print_json({'dry_run': dry_run, **plan.summary()})
        return
    console = out()
    for line in plan.describe():
        console.print(escape(line), highlight=False)
    if dry_run:
        console.print('dry run: nothing was changed', highlight=False)
    elif plan.changes_nothing or plan.copied is None:
        console.print('already adopted: nothing was changed', highlight=False)
    else:
        console.print(
            f'adopted: {len(plan.copied.copied)} run(s) converted, {len(plan.already_adopted)} already there; '
            f'the harness tables are kept ({", ".join(plan.adopted_tables.names())})',
            highlight=False,
        )
