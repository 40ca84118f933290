"""MongoDB's 16 MiB document limit, checked before writing so that an oversized item fails cleanly."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import bson

__all__ = ['MAX_DOCUMENT_BYTES', 'WIDEST_NUMBER', 'check_document_size']

MAX_DOCUMENT_BYTES: Final = 16 * 1024 * 1024
"""MongoDB's maximum BSON document size (16 MiB)."""

WIDEST_NUMBER: Final = 2**62
"""A number as wide as any real one in BSON, for measuring a document before numbering it."""

_GENERATED_ID_BYTES: Final = 17
"""What the driver's generated `_id` (an ObjectId) adds to a document that has none."""


def check_document_size(document: Mapping[str, Any], *, what: str, run_id: str, hint: str = '') -> None:
    """Raise `ValueError` naming the limit and the run if `document` would exceed 16 MiB once inserted."""
    size = len(bson.encode(document)) + (0 if '_id' in document else _GENERATED_ID_BYTES)
    if size > MAX_DOCUMENT_BYTES:
        raise ValueError(
            f'{what} of run {run_id!r} would be a {size}-byte document, over the MongoDB document size limit '
            f'of 16 MiB ({MAX_DOCUMENT_BYTES} bytes); nothing of it was written{hint}'
        )
