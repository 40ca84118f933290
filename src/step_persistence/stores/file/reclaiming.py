"""`collect_media` for `FileStepStore`: unused `messages.jsonl` lines, then unreferenced blobs.

**Messages.** For each run, under its exclusive lock, a line of `messages.jsonl` is kept while it
is its position's newest version (the next save may reuse it) or a retained snapshot uses it (see
`MessageJournal.resolve`). When some line is unused the file is rewritten without it (atomically,
temporary file and rename), message numbers unchanged. Other processes follow the file by byte
offset, so the run's incarnation token in `run.lock` is replaced first: every process then starts
its index of the run over at its next call (a crash between the two steps only costs them that
re-read). A run whose retained snapshot cannot be read is left as it is.

**Blobs.** The references are the media URIs written in the `messages.jsonl` of every run (read
without locks: a file is only appended to or replaced whole, and a line being appended belongs
to a save whose blobs were just stored or touched, which `grace` protects). A deleted run's
directory is gone, so its blobs are no longer referenced.
"""

from __future__ import annotations

import os
from datetime import timedelta
from functools import partial
from pathlib import Path

import anyio.to_thread

from step_persistence._reading import logger
from step_persistence.media.protocol import MediaStore
from step_persistence.reclaiming import MediaCollection, collect_blobs, uris_in, validate_grace
from step_persistence.stores.file._codec import load_snapshot_file
from step_persistence.stores.file._index import RunIndex
from step_persistence.stores.file._io import FileIo, UnsafePath, open_unlinked, real_directory
from step_persistence.stores.file._journal import read_lines
from step_persistence.stores.file._layout import RunPaths, is_run_directory_name
from step_persistence.stores.file._locking import RunNotRegistered, new_incarnation
from step_persistence.stores.file._sessions import RunSessions

__all__ = ['collect_media']


def _run_ids(directory: Path) -> list[str]:
    """The names of the run directories (symbolic links are never followed, see `_io`)."""
    try:
        entries = list(os.scandir(directory))
    except FileNotFoundError:
        return []
    return sorted(
        entry.name for entry in entries if is_run_directory_name(entry.name) and entry.is_dir(follow_symlinks=False)
    )


def _references(io: FileIo, directory: Path) -> set[str]:
    found: set[str] = set()
    for run_id in _run_ids(directory):
        try:
            found |= uris_in(io.read_all(RunPaths(directory / run_id).messages))
        except (FileNotFoundError, NotADirectoryError):
            continue  # deleted meanwhile, or not a run
        except UnsafePath as error:
            logger.warning('ignoring the messages of run %r in collect_media: %s', run_id, error)
    return found


def _used_numbers(io: FileIo, index: RunIndex) -> set[int] | None:
    """The message numbers to keep; `None` if a retained snapshot cannot be read."""
    messages = index.messages
    keep = {stored[-1].number for stored in messages.versions if stored}
    try:
        real_directory(index.paths.snapshots)
    except (OSError, ValueError):
        return None
    for seq, _ in index.snapshots.retained:
        try:
            _, history = load_snapshot_file(io.read_all(index.paths.snapshot(seq)))
        except (OSError, ValueError):
            return None
        for position in range(min(history.length, len(messages.versions))):
            version = messages.version_at(position, history.through_message)
            if version is not None:
                keep.add(version.number)
    return keep


def _compact(sessions: RunSessions, run_id: str) -> int:
    """Rewrite the run's `messages.jsonl` without the lines no one uses; how many were dropped."""
    io = sessions.io
    try:
        with sessions.session(run_id, exclusive=True) as index:
            index.snapshots.catch_up(io)
            index.messages.catch_up(io)
            keep = _used_numbers(io, index)
            if keep is None:
                return 0
            dropped = {
                version.span for stored in index.messages.versions for version in stored if version.number not in keep
            }
            if not dropped:
                return 0
            path = index.paths.messages
            lines = read_lines(path, io.read_all(path))
            kept = b''.join(line + b'\n' for span, line in lines if span not in dropped)
            _replace_incarnation(index.paths.lock_file, fsync=io.fsync)
            io.write_atomic(path, kept)
    except RunNotRegistered:
        return 0
    except UnsafePath as error:
        logger.warning('leaving run %r as it is in collect_media: %s', run_id, error)
        return 0
    sessions.forget(run_id)  # built from the file as it was
    return len(dropped)


def _replace_incarnation(lock_file: Path, *, fsync: bool) -> None:
    """Give the run a new incarnation token (same length, written in place), so every index restarts."""
    fd = open_unlinked(lock_file, os.O_WRONLY)
    try:
        os.pwrite(fd, new_incarnation().encode('ascii'), 0)
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)


async def collect_media(sessions: RunSessions, media_store: MediaStore | None, *, grace: timedelta) -> MediaCollection:
    """Drop unused message lines of every run under `sessions.directory`, then the blobs of `media_store`
    no remaining line refers to."""
    grace = validate_grace(grace)
    run_ids = await anyio.to_thread.run_sync(_run_ids, sessions.directory)
    reclaimed = 0
    for run_id in run_ids:
        reclaimed += await sessions.in_turn(run_id, partial(_compact, sessions, run_id))

    async def referenced() -> set[str]:
        return await anyio.to_thread.run_sync(_references, sessions.io, sessions.directory)

    blobs = await collect_blobs(media_store, grace=grace, referenced=referenced)
    return MediaCollection(messages=reclaimed, blobs=blobs)
