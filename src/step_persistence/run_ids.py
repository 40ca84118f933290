"""Run-id derivation and validation."""

from __future__ import annotations

import hashlib
import re

__all__ = ['DERIVED_HEX_DIGITS', 'MAX_RUN_ID_LENGTH', 'derive_run_id', 'validate_path_safe_run_id']

MAX_RUN_ID_LENGTH = 200
_PATH_SAFE = re.compile(r'[A-Za-z0-9_.-]{1,200}')
_KEPT = re.compile(r'[A-Za-z0-9_-]')
DERIVED_HEX_DIGITS = 16
"""Hex digits of the hash in a derived run id (64 bits: distinct for distinct runs of one agent)."""


def _escape(text: str) -> str:
    """Path-safe, injective spelling of `text`: `[A-Za-z0-9_-]` kept, anything else as `.xx` hex per UTF-8 byte.

    Every `.` in the output starts an escape and is followed by a hex digit, so the output never
    contains `..`.
    """
    return ''.join(
        char if _KEPT.fullmatch(char) else ''.join(f'.{byte:02x}' for byte in char.encode()) for char in text
    )


def derive_run_id(agent_name: str, pydantic_run_id: str) -> str:
    """The run id for `(agent_name, pydantic_run_id)`: `<agent_name>-<16 hex digits>`, path-safe.

    The same pair always gives the same id (a replayed run keeps its id), and distinct pairs give
    distinct ids: the agent name is spelled injectively (characters outside `[A-Za-z0-9_-]` as
    `.xx` escapes), and the digits are the start of the SHA-256 of the pair. Raises `ValueError`
    when the result would exceed 200 characters.
    """
    digest = hashlib.sha256(f'{agent_name}\0{pydantic_run_id}'.encode('utf-8', 'surrogatepass')).hexdigest()
    run_id = f'{_escape(agent_name)}-{digest[:DERIVED_HEX_DIGITS]}'
    if len(run_id) > MAX_RUN_ID_LENGTH:
        raise ValueError(
            f'run id derived from agent_name={agent_name!r} is {len(run_id)} characters long; '
            f'the limit is {MAX_RUN_ID_LENGTH}: use a shorter agent_name'
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
