"""`collect_media` for `FileStepStore`: unused message lines of every history line, then unreferenced blobs.

**Lines.** For each line, under its exclusive lock, a row is kept while a view uses it (a retained
snapshot of one of its users, or the base of a line branching from it; see `_usage`), and so is
the line's newest row, which holds the line's numbering: a number is never given twice in a line,
or a view could come to pick a row that was not there when it was saved. When some row is
unused, the file is rewritten without it (atomically, temporary file and rename), numbers
unchanged. Other processes follow the file by byte offset, so the line's token in `line.lock` is
replaced first: every process then starts its index of the line over at its next use (a crash
between the two steps only costs them that re-read). A line with no view left is removed whole.
A line one of whose users' snapshots cannot be read is left as it is. No `grace` is needed for
rows: a save holds its line's lock from its first row to its commit, so under the lock no row
belongs to a save in flight.

**Runs written before lines** keep their own `messages.jsonl`, compacted the same way under the
run's lock (rows their retained snapshots use; nothing appends there any more).

**Blobs.** The references are the media URIs written in every line's `messages.jsonl`, and in
those of runs written before lines (read without locks: a file is only appended to or replaced
whole, and a line being appended belongs to a save whose blobs were just stored or touched,
which `grace` protects). A removed line or run is gone, so its blobs are no longer referenced.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterable
from datetime import timedelta
from functools import partial
from pathlib import Path

import anyio.to_thread

from step_persistence._reading import logger
from step_persistence.media.protocol import MediaStore
from step_persistence.reclaiming import MediaCollection, collect_blobs, uris_in, validate_grace
from step_persistence.stores.file._codec import LegacyHistory, load_snapshot_file
from step_persistence.stores.file._index import RunIndex
from step_persistence.stores.file._io import FileIo, Span, UnsafePath, real_directory
from step_persistence.stores.file._journal import read_lines
from step_persistence.stores.file._layout import (
    DURABLE_DIRECTORY_NAME,
    JOURNAL_UNITS_FILE_NAME,
    LinePaths,
    RunPaths,
    is_run_directory_name,
    require_line_id,
)
from step_persistence.stores.file._lines import Lines
from step_persistence.stores.file._locking import LineMissing, RunNotRegistered, replace_token
from step_persistence.stores.file._message_journal import MessageJournal
from step_persistence.stores.file._sessions import RunSessions
from step_persistence.stores.file._usage import LineUsage, View, used_numbers

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


def _line_ids(lines: Lines) -> list[str]:
    found = []
    for name in sorted(lines.io.list_directory(lines.directory)):
        try:
            found.append(require_line_id(name))
        except ValueError:
            continue
    return found


def _message_files(directory: Path, lines: Lines) -> Iterable[Path]:
    for line_id in _line_ids(lines):
        yield LinePaths(lines.directory / line_id).messages
    for run_id in _run_ids(directory):
        yield RunPaths(directory / run_id).legacy_messages


def _journal_files(io: FileIo, directory: Path) -> Iterable[Path]:
    """The unit files of the durable journal, whose completed results may hold media markers too."""
    journal = directory / DURABLE_DIRECTORY_NAME
    try:
        names = io.list_directory(journal)
    except UnsafePath as error:
        logger.warning('ignoring %s in collect_media: %s', journal, error)
        return
    for name in sorted(names):
        yield journal / name / JOURNAL_UNITS_FILE_NAME


def _references(io: FileIo, directory: Path, lines: Lines) -> set[str]:
    found: set[str] = set()
    for path in itertools.chain(_message_files(directory, lines), _journal_files(io, directory)):
        try:
            found |= uris_in(io.read_all(path))
        except (FileNotFoundError, NotADirectoryError):
            continue  # removed meanwhile, or none
        except UnsafePath as error:
            logger.warning('ignoring %s in collect_media: %s', path, error)
    return found


def _rewrite(io: FileIo, messages: MessageJournal, keep: set[int], lock_file: Path) -> int:
    """Rewrite `messages`'s file without the rows not in `keep` (lines that are not rows stay); how many went."""
    dropped: set[Span] = {
        version.span for stored in messages.versions for version in stored if version.number not in keep
    }
    if not dropped:
        return 0
    path = messages.path
    lines = read_lines(path, io.read_all(path))
    kept = b''.join(line + b'\n' for span, line in lines if span not in dropped)
    replace_token(lock_file, io=io)
    io.write_atomic(path, kept)
    return len(dropped)


def _compact_line(lines: Lines, usage: LineUsage, line_id: str) -> int:
    """Drop the rows of `line_id` no view uses (the whole line when none does); how many went."""
    try:
        with lines.locked(line_id, exclusive=True) as index:
            try:
                views = usage.views(index)
            except ValueError as error:
                logger.warning('leaving history line %s as it is in collect_media: %s', line_id, error)
                return 0
            if views:
                messages = index.messages
                keep = used_numbers(messages.versions, views) | {messages.last_no}
                dropped = _rewrite(lines.io, messages, keep, index.paths.lock_file)
                if dropped:
                    lines.forget(line_id)  # built from the file as it was
                return dropped
    except LineMissing:
        return 0
    return usage.remove_if_unused(line_id)


def _legacy_views(io: FileIo, index: RunIndex) -> list[View] | None:
    """The views of the run's retained snapshots written before lines; `None` if one cannot be read."""
    found: list[View] = []
    try:
        real_directory(index.paths.snapshots)
        for seq, entry in index.snapshots.entries.items():
            if entry.view is None:
                _, history = load_snapshot_file(io.read_all(index.paths.snapshot(seq)))
                if not isinstance(history, LegacyHistory):
                    return None
                found.append((history.length, history.through_message))
    except (OSError, ValueError):
        return None
    return found


def _compact_legacy(sessions: RunSessions, run_id: str) -> int:
    """Rewrite the run's own `messages.jsonl` (written before lines) without the rows no snapshot uses."""
    io = sessions.io
    try:
        with sessions.session(run_id, exclusive=True) as index:
            if not index.paths.legacy_messages.exists():
                return 0
            index.snapshots.catch_up(io)
            messages = index.catch_up_legacy(io)
            views = _legacy_views(io, index)
            if views is None:
                return 0
            dropped = _rewrite(io, messages, used_numbers(messages.versions, views), index.paths.lock_file)
    except RunNotRegistered:
        return 0
    except UnsafePath as error:
        logger.warning('leaving run %r as it is in collect_media: %s', run_id, error)
        return 0
    if dropped:
        sessions.forget(run_id)  # built from the file as it was
    return dropped


async def collect_media(
    sessions: RunSessions, lines: Lines, usage: LineUsage, media_store: MediaStore | None, *, grace: timedelta
) -> MediaCollection:
    """Drop unused message rows of every line (and of runs written before lines) under
    `sessions.directory`, then the blobs of `media_store` no remaining row refers to."""
    grace = validate_grace(grace)
    directory = sessions.directory
    reclaimed = 0
    for run_id in await anyio.to_thread.run_sync(_run_ids, directory):
        reclaimed += await sessions.in_turn(run_id, partial(_compact_legacy, sessions, run_id))
    for line_id in await anyio.to_thread.run_sync(_line_ids, lines):
        reclaimed += await sessions.in_thread(partial(_compact_line, lines, usage, line_id))

    async def referenced() -> set[str]:
        return await anyio.to_thread.run_sync(_references, sessions.io, directory, lines)

    blobs = await collect_blobs(media_store, grace=grace, referenced=referenced)
    return MediaCollection(messages=reclaimed, blobs=blobs)
