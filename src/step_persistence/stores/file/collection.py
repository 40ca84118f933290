"""`collect_media` for `FileStepStore`: unreferenced blobs; `messages.jsonl` lines are kept.

The references are the media URIs written in the `messages.jsonl` of every run (read without
locks: the files only grow, and a line being appended belongs to a save whose blobs were just
stored or touched, which `grace` protects). A deleted run's directory is gone, so its blobs are
no longer referenced.

Message versions no retained snapshot uses are not reclaimed: `messages.jsonl` is append-only,
and every process follows it by byte offset, so removing lines would mean rewriting the file
under the run's lock and making every process re-read it. Such lines are rare (the earlier
versions of a message pydantic-ai completed in place, and histories that shrank) and small
(their payloads are in the media store), and they keep their blobs: `MediaCollection.messages`
is always 0 for this store (see docs/media.md).
"""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path

import anyio.to_thread

from step_persistence.collection import MediaCollection, collect_blobs, uris_in, validate_grace
from step_persistence.media.protocol import MediaStore
from step_persistence.stores.file._layout import RunPaths, is_run_directory_name

__all__ = ['collect_media']


def _references(directory: Path) -> set[str]:
    found: set[str] = set()
    try:
        entries = list(os.scandir(directory))
    except FileNotFoundError:
        return found
    for entry in entries:
        if not is_run_directory_name(entry.name):
            continue
        try:
            found |= uris_in(RunPaths(Path(entry.path)).messages.read_bytes())
        except (FileNotFoundError, NotADirectoryError):
            continue  # deleted meanwhile, or not a run
    return found


async def collect_media(directory: Path, media_store: MediaStore | None, *, grace: timedelta) -> MediaCollection:
    """Delete the blobs of `media_store` that no run's `messages.jsonl` refers to (touched before `grace`)."""
    grace = validate_grace(grace)

    async def referenced() -> set[str]:
        return await anyio.to_thread.run_sync(_references, directory)

    return MediaCollection(messages=0, blobs=await collect_blobs(media_store, grace=grace, referenced=referenced))
