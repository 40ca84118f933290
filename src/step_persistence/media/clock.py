"""The clock that stamps when media blobs were last written or reused, and that collection compares with.

Media stores stamp a blob's touched time with `media_now()`, the media walker times how long it
may skip re-checking a blob with it, and `collect_media` computes its cutoff from it. Tests move
it forward with `advanced_media_clock` to make blobs old without sleeping. An S3 bucket stamps
objects with the server's own clock (`LastModified`), which this clock cannot move.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Final

__all__ = ['REUSE_WINDOW', 'advanced_media_clock', 'media_now']

REUSE_WINDOW: Final = timedelta(minutes=10)
"""How long a writer may rely on a blob it stored or touched without touching it again.

The media walker remembers blobs it has put or touched for at most this long; after that it
touches them again (which refreshes their touched time) before writing a message that refers to
them. `collect_media(grace=...)` is safe while writers are active when `grace` exceeds this
window plus the longest time a save takes from storing its media to committing its messages.
"""

_offset = timedelta(0)


def media_now() -> datetime:
    """The current instant (aware, UTC) as media stores and collection see it."""
    return datetime.now(UTC) + _offset


@contextmanager
def advanced_media_clock(delta: timedelta) -> Iterator[None]:
    """For tests: within the block, `media_now()` is `delta` later than the real time (nests)."""
    global _offset
    previous = _offset
    _offset = previous + delta
    try:
        yield
    finally:
        _offset = previous
