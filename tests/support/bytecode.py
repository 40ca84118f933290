"""Bytecode cached for the test session and every process it starts, in a directory of its own.

Imported first by `tests/conftest.py`, for its effect. Where the environment sets
PYTHONDONTWRITEBYTECODE (this machine's does) and no bytecode was installed, every Python process
compiles every module it imports from source: about 2 s of CPU for pydantic-ai, SQLAlchemy and the
drivers, in each test worker and in each process the tests start (the command-line zygotes, writers
and crashing children, Alembic, the console script). Here the flag is lifted and bytecode goes to
PYTHONPYCACHEPREFIX (set, unless it is, to a private directory in the temporary directory: never
into the source tree or the environment), for this process and, through the environment, for every
process started after it.
"""

from __future__ import annotations

import os
import stat
import sys
import tempfile
from pathlib import Path


def cache_bytecode() -> None:
    """Write and read bytecode under a private prefix if the environment says not to write any."""
    if not sys.dont_write_bytecode:
        return
    prefix = Path(os.environ.get('PYTHONPYCACHEPREFIX') or Path(tempfile.gettempdir(), f'step-bytecode-{os.getuid()}'))
    prefix.mkdir(mode=0o700, exist_ok=True)
    owned = prefix.stat()
    if owned.st_uid != os.getuid() or owned.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return  # bytecode someone else can write would be code someone else runs
    os.environ.pop('PYTHONDONTWRITEBYTECODE', None)
    os.environ['PYTHONPYCACHEPREFIX'] = str(prefix)
    sys.pycache_prefix = str(prefix)
    sys.dont_write_bytecode = False


cache_bytecode()
