"""`HarnessFileStore`: the directory pydantic-ai-harness's `FileStepStore` wrote, read (`harness+file://`).

Its layout, as it writes it: `<directory>/<run_id>/run.json` (the run record),
`events.jsonl` and `tool_effects.jsonl` (one record a line; an effect once per change),
`snapshots/<n>.json` (a snapshot with its messages, `n` from 0), `snapshot-keys.jsonl` (its
idempotency keys, not needed to read), and the blobs of its default media store in
`<directory>/media/<sha256>.bin`. A line cut short by a crash, like any item that cannot be
read, is skipped and logged. Nothing is ever written, not even a directory.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import anyio.to_thread

from step_persistence._reading import read_each
from step_persistence.media.protocol import MediaStore
from step_persistence.media.uri import parse_media_uri
from step_persistence.stores.harness._base import HarnessStore, Stored, StoredSnapshot
from step_persistence.stores.harness._messages import MessagesColumn

__all__ = ['HarnessFileStore']


def _json_lines(path: Path | None) -> list[Stored]:
    """The JSON objects of a `.jsonl` file, each line that is not one skipped and logged; `[]` if there is none."""
    if path is None:
        return []
    try:
        lines = path.read_text(encoding='utf-8').splitlines()
    except FileNotFoundError:
        return []
    return read_each(
        (line for line in lines if line.strip()), lambda _: f'line of {path}', lambda line: _object(json.loads(line))
    )


def _object(value: Any) -> Stored:
    if not isinstance(value, dict):
        raise ValueError(f'expected a JSON object, got {type(value).__name__}')
    return value


def _snapshot_number(path: Path) -> int | None:
    return int(path.stem) if path.suffix == '.json' and path.stem.isdigit() else None


class HarnessFileStore(HarnessStore):
    """pydantic-ai-harness's file store at `directory`, read-only.

    `media_store`: where its externalized payloads are, when not in its default
    `<directory>/media/` (any of our media stores reads the same `media+sha256://` blobs).
    Raises `FileNotFoundError` on first use if `directory` does not exist.
    """

    def __init__(self, directory: str | os.PathLike[str], *, media_store: MediaStore | None = None) -> None:
        super().__init__(media_store=media_store)
        self.directory = Path(directory)

    @property
    def description(self) -> str:
        return f'the harness file store at {self.directory}'

    def _run_file(self, run_id: str, *names: str) -> Path | None:
        """A file of the run's directory; `None` for an id that names no directory inside the store."""
        if run_id in ('.', '..') or '/' in run_id or os.sep in run_id or '\0' in run_id:
            return None
        return self.directory.joinpath(run_id, *names)

    def _runs_on_disk(self) -> list[Stored]:
        if not self.directory.is_dir():
            raise FileNotFoundError(f'no harness file store at {self.directory}: the directory does not exist')
        files = sorted(path / 'run.json' for path in self.directory.iterdir() if (path / 'run.json').is_file())
        return read_each(files, str, lambda path: _object(json.loads(path.read_text(encoding='utf-8'))))

    async def _read_runs(self) -> list[Stored]:
        return await anyio.to_thread.run_sync(self._runs_on_disk)

    async def _read_events(self, run_id: str) -> list[Stored]:
        return await anyio.to_thread.run_sync(_json_lines, self._run_file(run_id, 'events.jsonl'))

    async def _read_effects(self, run_id: str) -> list[Stored]:
        return await anyio.to_thread.run_sync(_json_lines, self._run_file(run_id, 'tool_effects.jsonl'))

    def _snapshots_on_disk(self, run_id: str) -> list[StoredSnapshot]:
        folder = self._run_file(run_id, 'snapshots')
        if folder is None or not folder.is_dir():
            return []
        numbered = sorted((number, path) for path in folder.iterdir() if (number := _snapshot_number(path)) is not None)

        def read(path: Path) -> StoredSnapshot:
            stored = _object(json.loads(path.read_text(encoding='utf-8')))
            return StoredSnapshot(stored, MessagesColumn.parse(stored.get('messages')).resolve({}))

        return read_each((path for _, path in numbered), str, read)

    async def _read_snapshots(self, run_id: str) -> list[StoredSnapshot]:
        return await anyio.to_thread.run_sync(self._snapshots_on_disk, run_id)

    async def _read_blob(self, uri: str) -> bytes:
        path = self.directory / 'media' / f'{parse_media_uri(uri)}.bin'
        try:
            return await anyio.to_thread.run_sync(path.read_bytes)
        except FileNotFoundError:
            raise LookupError(f'blob {uri} is not in {path.parent}') from None

    async def aclose(self) -> None:
        return None
