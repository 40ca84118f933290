"""The tests' zygote: imports the whole package once, then runs each command in a forked child.

Usage: python cli_zygote.py. Prints `ready` once every module is imported (see `import_everything`).
Then, for each JSON line read on stdin, `{"args": [...], "cwd": ..., "env": {...}, "stdout": path,
"stderr": path}`, it forks a child that runs `step-persistence ARGS...` as the console script does
(`step_persistence.cli:main`), or `python SCRIPT ARGS...` if the line also has `"script": SCRIPT`, in
that directory and environment, with its output written to those files and its stdin on /dev/null,
and prints `{"status": <exit code>}` once the child ended. A child still running after
`LIMIT_SECONDS` is ended by SIGALRM (status -14).

A command costs a fork instead of a new interpreter importing pydantic-ai, SQLAlchemy and the
drivers (about 2.5 s each), which made the command-line tests most of the suite's time. The commands
import most of that only when they run, so the zygote imports it first: otherwise every child would.
"""

from __future__ import annotations

import importlib
import inspect
import json
import os
import pkgutil
import runpy
import signal
import sys
import traceback
from typing import Any, NoReturn

import aiosqlite  # noqa: F401  (every import here is done once, before forking)
import alembic.command  # noqa: F401
import anyio._backends._asyncio  # noqa: F401
import asyncpg  # noqa: F401
import pydantic
import pymongo  # noqa: F401
import rich._emoji_codes
import rich.progress  # noqa: F401
import sqlalchemy.dialects.postgresql.asyncpg
import sqlalchemy.dialects.sqlite.aiosqlite  # noqa: F401
from pydantic_ai import Agent  # noqa: F401

import step_persistence
import step_persistence.records
from step_persistence.cli import main

LIMIT_SECONDS = 120


def exit_status(code: Any) -> int:
    """The process exit status Python gives `SystemExit(code)` (printing a non-int code to stderr)."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def run_request(request: dict[str, Any]) -> None:
    """`step-persistence ARGS...` (the console script's entry point), or `python SCRIPT ARGS...`."""
    script = request.get('script')
    if script is None:
        sys.argv = ['step-persistence', *request['args']]
        main()
        return
    sys.argv = [script, *request['args']]
    sys.path[0] = os.path.dirname(script)
    runpy.run_path(script, run_name='__main__')


def run_command(request: dict[str, Any]) -> NoReturn:
    """In the child: run `request` (see `run_request`), then exit with its status."""
    status = 1
    try:
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        for fd, path in ((1, request['stdout']), (2, request['stderr'])):
            target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            os.dup2(target, fd)
            os.close(target)
        os.chdir(request['cwd'])
        os.environ.clear()
        os.environ.update(request['env'])
        signal.alarm(LIMIT_SECONDS)
        try:
            run_request(request)
            status = 0
        except SystemExit as exit:
            status = exit_status(exit.code)
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)


def import_everything() -> None:
    """Every module of the package (commands import theirs when they run: the stores, pydantic-ai, rich,
    Alembic) and every record's validator built (each is built on first use), so no child does either."""
    for module in pkgutil.walk_packages(step_persistence.__path__, 'step_persistence.'):
        if module.name == 'step_persistence.migrations.env':  # Alembic's script, run inside a migration
            continue
        try:
            importlib.import_module(module.name)
        except Exception:  # left to the child that imports it, which reports the error as a command would
            continue
    records = [value for value in vars(step_persistence.records).values() if inspect.isclass(value)]
    for record in records:
        if issubclass(record, pydantic.BaseModel) and record.__module__ == step_persistence.records.__name__:
            record.model_rebuild()


def serve() -> None:
    import_everything()
    print('ready', flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        child = os.fork()
        if child == 0:
            run_command(request)
        _, wait_status = os.waitpid(child, 0)
        print(json.dumps({'status': os.waitstatus_to_exitcode(wait_status)}), flush=True)


if __name__ == '__main__':
    serve()
