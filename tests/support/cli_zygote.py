"""The command line's zygote: imports it and every store once, then runs each command in a forked child.

Usage: python cli_zygote.py. Prints `ready` once imported. Then, for each JSON line read on stdin,
`{"args": [...], "cwd": ..., "env": {...}, "stdout": path, "stderr": path}`, it forks a child that
runs `step-persistence ARGS...` as the console script does (`step_persistence.cli:main`), in that
directory and environment, with its output written to those files and its stdin on /dev/null, and
prints `{"status": <exit code>}` once the child ended. A child still running after
`LIMIT_SECONDS` is ended by SIGALRM (status -14).

A command costs a fork instead of a new interpreter importing pydantic-ai, SQLAlchemy and the
drivers (about 2.5 s each), which made the command-line tests most of the suite's time.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import traceback
from typing import Any, NoReturn

import aiosqlite  # noqa: F401  (every import below is done once, before forking)
import alembic.command  # noqa: F401
import asyncpg  # noqa: F401
import pymongo  # noqa: F401

import step_persistence.copying
import step_persistence.media.disk
import step_persistence.migrations.environment
import step_persistence.reporting
import step_persistence.stores.file
import step_persistence.stores.mongo
import step_persistence.stores.mongo.media_store
import step_persistence.stores.sql  # noqa: F401
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


def run_command(request: dict[str, Any]) -> NoReturn:
    """In the child: run the console script's entry point on `request`, then exit with its status."""
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
        sys.argv = ['step-persistence', *request['args']]
        try:
            main()
            status = 0
        except SystemExit as exit:
            status = exit_status(exit.code)
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)


def serve() -> None:
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
