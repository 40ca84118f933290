"""Reclaiming what no retained snapshot needs: stored message versions and media blobs (`collect_media`).

Every step store has `collect_media(*, grace)`. It first deletes the stored message versions that
no retained snapshot uses (keeping, for every history position of every run, its newest version,
which the next save of the run may reuse), then the blobs of its media store that no stored
message refers to. See docs/media.md ("Collecting orphaned media") for the rules that make this
safe while other processes write.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta

from step_persistence.media.clock import media_now
from step_persistence.media.protocol import CollectableMediaStore, MediaStore
from step_persistence.media.walker import forget_stored_blob

__all__ = ['MediaCollection', 'collect_blobs', 'uris_in', 'validate_grace']

logger = logging.getLogger('step_persistence.collection')

_URI = re.compile(rb'media\+sha256://[0-9a-f]{64}')


@dataclass(frozen=True, slots=True)
class MediaCollection:
    """What one `collect_media` call reclaimed."""

    messages: int
    """Stored message versions deleted (no retained snapshot used them)."""
    blobs: int
    """Media blobs deleted (no stored message referred to them)."""


def validate_grace(grace: timedelta) -> timedelta:
    """Return `grace` if it is a `timedelta` of zero or more; otherwise raise `ValueError`."""
    if not isinstance(grace, timedelta) or grace < timedelta(0):
        raise ValueError(f'grace must be a timedelta >= 0, got {grace!r}')
    return grace


def uris_in(stored: bytes | str) -> set[str]:
    """Every media URI written in a stored message (its JSON text, markers and all).

    A plain scan of the text rather than a parse: it never misses a marker, also in a message it
    could not parse, and a user string that happens to spell a URI only keeps that blob alive.
    """
    data = stored.encode('utf-8', 'surrogatepass') if isinstance(stored, str) else stored
    return {match.decode('ascii') for match in _URI.findall(data)}


async def collect_blobs(
    media_store: MediaStore | None,
    *,
    grace: timedelta,
    referenced: Callable[[], Awaitable[set[str]]],
) -> int:
    """Delete the blobs of `media_store` touched more than `grace` ago that `referenced()` does not name.

    The blobs are listed (with their touched times) before the references are read, and each is
    deleted only if it was not touched since the cutoff: a writer that reused a blob after the
    listing has touched it, and one that reused it before has committed its message by the time
    the references are read, or touched it within `grace` (see docs/media.md). Returns how many
    blobs were deleted; 0 for a store that cannot list its blobs (or for no store).
    """
    grace = validate_grace(grace)
    if not isinstance(media_store, CollectableMediaStore):
        return 0
    cutoff = media_now() - grace
    candidates = [blob async for blob in media_store.list_blobs() if blob.touched_at < cutoff]
    if not candidates:
        return 0
    uris = await referenced()
    deleted = 0
    for blob in candidates:
        if blob.uri not in uris and await media_store.delete_blob(blob, touched_before=cutoff):
            forget_stored_blob(media_store, blob.uri)
            deleted += 1
    if deleted:
        logger.info('deleted %d unreferenced media blobs from %r', deleted, media_store)
    return deleted
