"""Run-id derivation and validation."""

from __future__ import annotations

import re

__all__ = ['MAX_RUN_ID_LENGTH', 'derive_run_id', 'validate_path_safe_run_id']

MAX_RUN_ID_LENGTH = 200
_PATH_SAFE = re.compile(r'[A-Za-z0-9_.-]{1,200}')
_KEPT = re.compile(r'[A-Za-z0-9_-]')
_SEPARATOR = '.-'


def _escape(text: str) -> str:
    """Path-safe, injective spelling of `text`: `[A-Za-z0-9_-]` kept, anything else as `.xx` hex per UTF-8 byte.

    Every `.` in the output starts an escape and is followed by a hex digit, so the output never
    contains `..` or the separator `.-`.
    """
    return ''.join(
        char if _KEPT.fullmatch(char) else ''.join(f'.{byte:02x}' for byte in char.encode()) for char in text
    )


def derive_run_id(agent_name: str, pydantic_run_id: str) -> str:
    """The run id for `(agent_name, pydantic_run_id)`: readable, path-safe, and distinct for distinct pairs.

    Raises `ValueError` when the result would exceed 200 characters.
    """
    run_id = f'{_escape(agent_name)}{_SEPARATOR}{_escape(pydantic_run_id)}'
    if len(run_id) > MAX_RUN_ID_LENGTH:
        raise ValueError(
            f'run id derived from agent_name={agent_name!r} and run id {pydantic_run_id!r} is {len(run_id)} '
            f'characters long; the limit is {MAX_RUN_ID_LENGTH}: use a shorter agent_name'
        )
    return run_id


def validate_path_safe_run_id(run_id: str) -> str:
    """Return `run_id` if it matches `[A-Za-z0-9_.-]{1,200}`, has no `..` and is not `.`; else raise `ValueError`."""
    if not isinstance(run_id, str) or not _PATH_SAFE.fullmatch(run_id) or '..' in run_id or run_id == '.':
        raise ValueError(
            f'run_id {run_id!r} is not path-safe: it must match [A-Za-z0-9_.-]{{1,200}}, '
            'not contain "..", and not be "."'
        )
    return run_id
