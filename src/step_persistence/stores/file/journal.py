"""`FileJournal`: the durable journal (`JournalStore`) in a `FileStepStore`'s directory.

```
<directory>/@durable/<key>/    per workflow (`key`: the SHA-256 of its id, never the raw id)
  workflow.jsonl               its starts and ends, one line each, appended (the first start is its record)
  units.jsonl                  one line per unit write, appended
```

Both files are append-only and read by folding their lines: the first `start` line is the
workflow's record and each later one counts an attempt (a caller finds its own start by a token,
so concurrent starts, in threads or processes, each get their own count); `claim`, `renew` and `end`
lines move its lease; the units fold by `next_unit_state`, so a `completed` unit stays as it was
whatever is appended after it. An append is one `write` of a whole line followed by `fsync`; a torn
last line (a crash mid-append) is ignored.

The lease is compared and set under `workflow.jsonl`'s `flock`: a claim, a renewal and an end hold it
exclusively while they fold the file and append, a fenced unit write holds it shared while it checks
the lease and appends its unit, so no claim lands between a fenced write's check and its line.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
from contextlib import AbstractContextManager
from datetime import datetime
from pathlib import Path
from typing import Any

import anyio.to_thread

from step_persistence._arguments import require_text
from step_persistence._reading import logger
from step_persistence.durable.errors import LeaseLostError
from step_persistence.durable.records import (
    DurableUnit,
    Fence,
    WorkflowRecord,
    WorkflowStatus,
    holds_lease,
    lease_is_free,
    next_unit_state,
)
from step_persistence.records import utc_now
from step_persistence.stores.file._layout import DURABLE_DIRECTORY_NAME, JOURNAL_UNITS_FILE_NAME, text_key
from step_persistence.stores.file._locking import locked_file
from step_persistence.stores.file.store import FileStepStore

__all__ = ['DURABLE_DIRECTORY_NAME', 'FileJournal']


def _append(path: Path, line: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    encoded = json.dumps(line, ensure_ascii=False).encode() + b'\n'
    descriptor = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(descriptor, encoded)
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _lines(path: Path) -> list[dict[str, Any]]:
    """The file's lines, decoded; a line that does not decode is logged and skipped (a torn last one silently)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    raw = data.split(b'\n')
    found: list[dict[str, Any]] = []
    for number, line in enumerate(raw):
        if not line:
            continue
        try:
            decoded = json.loads(line)
            if not isinstance(decoded, dict):
                raise ValueError(f'a line must be a JSON object, not {type(decoded).__name__}')
        except ValueError as error:
            if number < len(raw) - 1:  # the last line, without its newline, is a torn append
                logger.warning('skipping line %d of %s: %s', number + 1, path, error)
            continue
        found.append(decoded)
    return found


_RELEASED: dict[str, Any] = {'owner': None, 'lease_expires_at': None}


def _fold_workflow(lines: list[dict[str, Any]], *, token: str | None = None) -> WorkflowRecord | None:
    """The workflow as its lines leave it (with `token`: as the start bearing it left it)."""
    state: WorkflowRecord | None = None
    mine: WorkflowRecord | None = None
    for line in lines:
        try:
            if line.get('op') == 'start':
                started = WorkflowRecord.model_validate(line['record'])
                if state is None:
                    state = started
                else:
                    update = {'attempts': state.attempts + 1, 'status': 'running', 'updated_at': started.updated_at}
                    state = state.model_copy(update=update)
                if token is not None and line.get('token') == token:
                    mine = state
            elif line.get('op') == 'end' and state is not None:
                state = WorkflowRecord.model_validate(
                    {**state.model_dump(), 'status': line['status'], 'updated_at': line['at'], **_RELEASED}
                )
            elif line.get('op') == 'claim' and state is not None:
                claimed = {'owner': line['owner'], 'lease_expires_at': line['lease_expires_at']}
                state = WorkflowRecord.model_validate(
                    {**state.model_dump(), **claimed, 'fencing_epoch': line['epoch'], 'updated_at': line['at']}
                )
            elif (
                line.get('op') == 'renew'
                and state is not None
                and holds_lease(state, Fence(owner=line['owner'], epoch=line['epoch']))
            ):
                state = WorkflowRecord.model_validate(
                    {**state.model_dump(), 'lease_expires_at': line['lease_expires_at']}
                )
        except (KeyError, ValueError) as error:
            logger.warning('skipping a damaged line of a durable workflow: %r', error)
    return mine if token is not None else state


class FileJournal:
    """The journal of `store`'s directory; each operation is one call to a worker thread."""

    def __init__(self, store: FileStepStore) -> None:
        self._root = store.directory / DURABLE_DIRECTORY_NAME

    def __repr__(self) -> str:
        return f'FileJournal({str(self._root)!r})'

    def _directory(self, workflow_id: str) -> Path:
        return self._root / text_key(workflow_id)

    async def start_workflow(self, record: WorkflowRecord) -> WorkflowRecord:
        require_text('workflow_id', record.workflow_id)
        path = self._directory(record.workflow_id) / 'workflow.jsonl'
        token = secrets.token_hex(16)

        def start() -> WorkflowRecord | None:
            _append(path, {'op': 'start', 'token': token, 'record': record.model_dump(mode='json')})
            return _fold_workflow(_lines(path), token=token)

        started = await anyio.to_thread.run_sync(start)
        if started is None:
            raise ValueError(f'durable workflow {record.workflow_id!r}: its start could not be read back')
        return started

    async def get_workflow(self, *, workflow_id: str) -> WorkflowRecord | None:
        require_text('workflow_id', workflow_id)
        path = self._directory(workflow_id) / 'workflow.jsonl'
        return await anyio.to_thread.run_sync(lambda: _fold_workflow(_lines(path)))

    @staticmethod
    def _locked(path: Path, workflow_id: str, *, exclusive: bool) -> AbstractContextManager[int]:
        """Hold `workflow.jsonl`'s lock (`LookupError` if the workflow is not stored)."""

        def missing() -> LookupError:
            return LookupError(f'no durable workflow {workflow_id!r} is stored')

        return locked_file(path, exclusive=exclusive, missing=missing)

    def _stored(self, workflow_id: str, fence: Fence | None) -> WorkflowRecord:
        """The workflow as stored, `fence` checked (called holding its lock)."""
        stored = _fold_workflow(_lines(self._directory(workflow_id) / 'workflow.jsonl'))
        if stored is None:
            raise LookupError(f'no durable workflow {workflow_id!r} is stored')
        if fence is not None and not holds_lease(stored, fence):
            raise LeaseLostError(workflow_id=workflow_id, owner=fence.owner, epoch=fence.epoch)
        return stored

    async def claim_workflow(
        self,
        *,
        workflow_id: str,
        owner: str,
        lease_expires_at: datetime,
        now: datetime,
        running_only: bool = False,
        take_over: bool = False,
    ) -> WorkflowRecord | None:
        require_text('workflow_id', workflow_id)
        require_text('owner', owner)
        path = self._directory(workflow_id) / 'workflow.jsonl'

        def claim() -> WorkflowRecord | None:
            try:
                with self._locked(path, workflow_id, exclusive=True):
                    stored = self._stored(workflow_id, None)
                    if not (take_over or lease_is_free(stored, now)) or (running_only and stored.status != 'running'):
                        return stored
                    line = {
                        'op': 'claim',
                        'owner': owner,
                        'lease_expires_at': lease_expires_at.isoformat(),
                        'epoch': stored.fencing_epoch + 1,
                        'at': now.isoformat(),
                    }
                    _append(path, line)
                    return _fold_workflow(_lines(path))
            except LookupError:
                return None

        return await anyio.to_thread.run_sync(claim)

    async def renew_lease(self, *, workflow_id: str, fence: Fence, lease_expires_at: datetime) -> bool:
        require_text('workflow_id', workflow_id)
        path = self._directory(workflow_id) / 'workflow.jsonl'

        def renew() -> bool:
            try:
                with self._locked(path, workflow_id, exclusive=True):
                    self._stored(workflow_id, fence)
                    line = {'op': 'renew', **fence.model_dump(), 'lease_expires_at': lease_expires_at.isoformat()}
                    _append(path, line)
                    return True
            except (LookupError, LeaseLostError):
                return False

        return await anyio.to_thread.run_sync(renew)

    async def list_abandoned(self, *, now: datetime) -> list[WorkflowRecord]:
        def scan() -> list[WorkflowRecord]:
            try:
                directories = sorted(self._root.iterdir())
            except FileNotFoundError:
                return []
            found = (_fold_workflow(_lines(directory / 'workflow.jsonl')) for directory in directories)
            abandoned = [
                record
                for record in found
                if record is not None and record.status == 'running' and lease_is_free(record, now)
            ]
            return sorted(abandoned, key=lambda record: (record.updated_at, record.workflow_id))

        return await anyio.to_thread.run_sync(scan)

    async def end_workflow(self, *, workflow_id: str, status: WorkflowStatus, fence: Fence | None = None) -> None:
        require_text('workflow_id', workflow_id)
        path = self._directory(workflow_id) / 'workflow.jsonl'

        def end() -> None:
            with self._locked(path, workflow_id, exclusive=True):
                self._stored(workflow_id, fence)
                _append(path, {'op': 'end', 'status': status, 'at': utc_now().isoformat()})

        await anyio.to_thread.run_sync(end)

    async def record_unit(self, unit: DurableUnit, *, fence: Fence | None = None) -> None:
        require_text('workflow_id', unit.workflow_id)
        directory = self._directory(unit.workflow_id)

        def record() -> None:
            with self._locked(directory / 'workflow.jsonl', unit.workflow_id, exclusive=False):
                self._stored(unit.workflow_id, fence)
                _append(directory / JOURNAL_UNITS_FILE_NAME, unit.model_dump(mode='json'))

        await anyio.to_thread.run_sync(record)

    async def list_units(self, *, workflow_id: str) -> list[DurableUnit]:
        require_text('workflow_id', workflow_id)
        path = self._directory(workflow_id) / JOURNAL_UNITS_FILE_NAME

        def fold() -> list[DurableUnit]:
            units: dict[str, DurableUnit] = {}
            for line in _lines(path):
                try:
                    unit = DurableUnit.model_validate(line)
                except ValueError as error:
                    logger.warning('skipping a damaged unit of durable workflow %r: %r', workflow_id, error)
                    continue
                written = next_unit_state(units.get(unit.unit_key), unit)
                if written is not None:
                    units[unit.unit_key] = written
            return sorted(units.values(), key=lambda each: (each.started_at, each.unit_key))

        return await anyio.to_thread.run_sync(fold)

    async def delete_workflow(self, *, workflow_id: str) -> None:
        require_text('workflow_id', workflow_id)
        directory = self._directory(workflow_id)
        await anyio.to_thread.run_sync(lambda: shutil.rmtree(directory, ignore_errors=True))
