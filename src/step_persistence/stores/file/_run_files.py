"""A run's record on disk: `run.json`, the `RunRecord` itself, and `registration.json`, its stamp.

`run.json` is exactly the record's JSON (indented), so `RunRecord.model_validate_json` reads it
and `jq .agent_name run.json` prints a field. The registration stamp (nanoseconds, strictly
increasing within a process: it orders runs registered with the same `started_at` and names the
run's conversation entries) is kept beside it in `registration.json`, `{"registered_ns": <int>}`.
Both are written once, when the run is registered, and never rewritten, but for a bare run (registered
by a write, `stores/_bare.py`): its `registration.json` also holds `"bare": true`, and the
`register_run` filling it in replaces `run.json` (its commit), then writes `registration.json`
without the mark, keeping the stamp. A run is bare while both say so (`read_registration`): a fill
that crashed between the two left a filled `run.json`, which counts.

Directories written before issue 19 hold both in `run.json` alone, `{"run": <RunRecord>,
"registered_ns": <int>}`, and no `registration.json`. They are read as they are (never rewritten:
reading writes nothing), and go on being written in place: the other files of a run do not depend
on how its record is spelled.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, StrictInt, ValidationError

from step_persistence.records import RunRecord
from step_persistence.stores._bare import looks_bare
from step_persistence.stores.file._codec import indented, json_object, natural_number
from step_persistence.stores.file._io import FileIo
from step_persistence.stores.file._layout import RunPaths

__all__ = [
    'dump_registration_file',
    'dump_run_file',
    'load_run_file',
    'read_record',
    'read_registration',
    'read_run',
    'read_stamp',
    'stored_run_id',
]


def dump_run_file(record: RunRecord) -> bytes:
    """`run.json`: the record itself, indented."""
    return indented(record.model_dump(mode='json'))


def dump_registration_file(registered_ns: int, *, bare: bool = False) -> bytes:
    """`registration.json`: the stamp that orders runs registered at the same instant (and, for a bare run,
    its mark)."""
    return indented({'registered_ns': registered_ns, 'bare': True} if bare else {'registered_ns': registered_ns})


class _WrappedRunFile(BaseModel):
    """`run.json` as written before issue 19."""

    model_config = ConfigDict(extra='forbid')

    run: RunRecord
    registered_ns: StrictInt


def _is_wrapped(value: dict[str, Any]) -> bool:
    return 'run' in value and 'run_id' not in value


def _wrapped(data: bytes) -> bool:
    """Whether `data` is a JSON object of the older, wrapped spelling."""
    try:
        return _is_wrapped(json_object(data, 'run file'))
    except ValueError:
        return False


def load_run_file(data: bytes) -> tuple[RunRecord, int | None]:
    """The record of a `run.json`, and the stamp when the file is of the older, wrapped spelling
    (`None`: it is in `registration.json`); `ValueError` (a pydantic `ValidationError`) naming the
    field for anything malformed. A file of today's spelling is parsed once (listing every run
    reads every `run.json`)."""
    try:
        return RunRecord.model_validate_json(data), None
    except ValidationError:
        if not _wrapped(data):
            raise
    wrapped = _WrappedRunFile.model_validate_json(data)
    return wrapped.run, wrapped.registered_ns


def stored_run_id(data: bytes) -> object:
    """The `run_id` a `run.json` names, of either spelling, without validating the rest (`None` if none)."""
    value = json_object(data, 'run file')
    record = value.get('run') if _is_wrapped(value) else value
    return record.get('run_id') if isinstance(record, dict) else None


def _load_registration_file(data: bytes) -> tuple[int, bool]:
    """The stamp and whether the file marks the run bare."""
    value = json_object(data, 'registration file')
    bare = value.get('bare', False)
    if not isinstance(bare, bool):
        raise ValueError(f'bare must be true or false, got {bare!r}')
    return natural_number(value.get('registered_ns'), 'registered_ns'), bare


def read_record(io: FileIo, paths: RunPaths) -> tuple[RunRecord, int | None]:
    """The run's record, and its stamp if `run.json` holds it (the older spelling): one file read."""
    return load_run_file(io.read_all(paths.run_file))


def read_run(io: FileIo, paths: RunPaths) -> tuple[RunRecord, int]:
    """The run's record and registration stamp."""
    record, stamp = read_record(io, paths)
    return record, _load_registration_file(io.read_all(paths.registration_file))[0] if stamp is None else stamp


def read_stamp(io: FileIo, paths: RunPaths) -> int:
    """The run's registration stamp: `registration.json`, or, in a run written before it, `run.json`."""
    try:
        return _load_registration_file(io.read_all(paths.registration_file))[0]
    except FileNotFoundError:
        stamp = read_record(io, paths)[1]
    if stamp is None:
        raise ValueError(f'{paths.registration_file} is missing')
    return stamp


def read_registration(io: FileIo, paths: RunPaths) -> tuple[int, bool]:
    """The run's registration stamp, and whether the run is bare (its `registration.json` marks it so and its
    `run.json` holds a bare run's record)."""
    try:
        stamp, bare = _load_registration_file(io.read_all(paths.registration_file))
    except FileNotFoundError:
        return read_stamp(io, paths), False
    return stamp, bare and looks_bare(read_record(io, paths)[0])
