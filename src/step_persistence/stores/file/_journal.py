"""Following an append-only `.jsonl` file incrementally, tolerating a torn final line.

A `Journal` remembers how far into its file this process has read. Catching up reads only the bytes
appended since (by this or any other process), so the cost of an append does not grow with the
file. Callers hold the run's lock while catching up and appending, so the file never changes
underneath them.

A final line without its newline can only be left by a crash in the middle of an append: it is
ignored (and logged), and the next append starts with a newline so that its own lines stay whole.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Generic, TypeVar

from step_persistence._reading import logger, read_or_skip
from step_persistence.stores.file._io import FileIo, Span

__all__ = ['Journal', 'read_lines']

EntryT = TypeVar('EntryT')


def read_lines(path: Path, data: bytes, *, base: int = 0, log_torn: bool = True) -> list[tuple[Span, bytes]]:
    """The complete lines of `data` (read from `path` at offset `base`) with their spans.

    A torn final line is left out (and logged, unless `log_torn` is false: a reader without the
    file's lock may see an append in progress).
    """
    lines: list[tuple[Span, bytes]] = []
    start = 0
    while (newline := data.find(b'\n', start)) != -1:
        lines.append(((base + start, newline - start), data[start:newline]))
        start = newline + 1
    if start < len(data) and log_torn:
        logger.warning(
            'ignoring torn final line of %s at byte %d (%d bytes; an interrupted append)',
            path,
            base + start,
            len(data) - start,
        )
    return lines


class Journal(ABC, Generic[EntryT]):
    """What this process has read of one `.jsonl` file, plus the state derived from its lines."""

    def __init__(self, path: Path, *, locked: bool = True) -> None:
        self.path = path
        self.locked = locked
        """Whether the file is read under its lock (else a torn final line may be an append in progress)."""
        self.run_id = path.parent.name
        """The run whose file this is (its directory's name): a line naming another run is damaged."""
        self.offset = 0
        """How many bytes of the file have been read and applied."""
        self.torn = False
        """Whether the file currently ends in the middle of a line."""
        self.size = 0
        """The file's size when it was last caught up with (what `parse` may check a line against)."""
        self.clear()

    @abstractmethod
    def parse(self, line: bytes) -> EntryT:
        """The entry one line holds; raises for an unreadable line (which is then skipped and logged)."""

    @abstractmethod
    def apply(self, entry: EntryT, span: Span) -> None:
        """Fold one entry, found at `span` of the file, into the derived state."""

    @abstractmethod
    def clear(self) -> None:
        """Forget the derived state (the file is read again from its start)."""

    def catch_up(self, io: FileIo) -> None:
        """Apply every line appended since the last catch-up.

        Reads one byte before the new ones, the newline that ended the last line read, to notice a
        file that changed other than by appends (truncated or edited by hand); it is then read
        again from its start.
        """
        anchored = self.offset > 0 and not self.torn
        size, data = io.read_from(self.path, self.offset - 1 if anchored else self.offset)
        if size < self.offset or (anchored and not data.startswith(b'\n')):
            logger.warning('%s changed other than by appends; reading it again', self.path)
            self.clear()
            self.offset, self.torn = 0, False
            size, data = io.read_from(self.path, 0)
        elif anchored:
            data = data[1:]
        self.size = size
        for span, line in read_lines(self.path, data, base=self.offset, log_torn=self.locked):
            entry = read_or_skip(f'line at byte {span[0]} of {self.path}', partial(self.parse, line))
            if entry is not None:
                self.apply(entry, span)
        if data:
            self.torn = not data.endswith(b'\n')
        self.offset += len(data)

    def append(self, io: FileIo, entries: Sequence[tuple[bytes, EntryT]]) -> None:
        """Append one line per `(line, entry)` in a single write, then apply the entries.

        The journal must be caught up, under the run's exclusive lock.
        """
        if not entries:
            return
        prefix = b'\n' if self.torn else b''
        payload = prefix + b''.join(line + b'\n' for line, _ in entries)
        io.append(self.path, payload)
        position = self.offset + len(prefix)
        for line, entry in entries:
            self.apply(entry, (position, len(line)))
            position += len(line) + 1
        self.offset += len(payload)
        self.torn = False
