"""Where everything of a `FileStepStore` lives on disk.

```
<directory>/
  <run_id>/                 one directory per run (run ids are validated path-safe names)
    run.json                the RunRecord and its registration order
    run.lock                lock file (fcntl.flock); holds the run's incarnation token
    events.jsonl            one StepEvent per line, append order
    tool_effects.jsonl      one merged ToolEffectRecord per line; the last line of a call wins
    messages.jsonl          every version of every history position, once, numbered
    snapshots.jsonl         journal of saved snapshots (seq, state, key): the commit point
    snapshots/<seq>.json    one snapshot header plus a constant-size reference to its messages
  @media/                   media blobs of the default DiskMediaStore
  @tmp/                     staging of registrations and deleted runs
```

Store-owned names contain `@`, which no valid run id can contain, so a run can never shadow them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from step_persistence._arguments import require_text
from step_persistence.run_ids import validate_path_safe_run_id

__all__ = [
    'MEDIA_DIRECTORY_NAME',
    'RESERVED_NAMES',
    'RUN_FILE_NAME',
    'WORK_DIRECTORY_NAME',
    'RunPaths',
    'is_run_directory_name',
    'run_paths',
]

MEDIA_DIRECTORY_NAME = '@media'
"""Directory under the store's root where the default media store keeps its blobs."""
WORK_DIRECTORY_NAME = '@tmp'
"""Directory under the store's root where registrations are staged and deleted runs are removed."""
RESERVED_NAMES = frozenset({MEDIA_DIRECTORY_NAME, WORK_DIRECTORY_NAME})
RUN_FILE_NAME = 'run.json'
"""A run's record, in its directory."""


@dataclass(frozen=True)
class RunPaths:
    """The paths of one run's files."""

    directory: Path

    @property
    def run_file(self) -> Path:
        return self.directory / RUN_FILE_NAME

    @property
    def lock_file(self) -> Path:
        return self.directory / 'run.lock'

    @property
    def events(self) -> Path:
        return self.directory / 'events.jsonl'

    @property
    def tool_effects(self) -> Path:
        return self.directory / 'tool_effects.jsonl'

    @property
    def messages(self) -> Path:
        return self.directory / 'messages.jsonl'

    @property
    def snapshot_journal(self) -> Path:
        return self.directory / 'snapshots.jsonl'

    @property
    def snapshots(self) -> Path:
        return self.directory / 'snapshots'

    def snapshot(self, seq: int) -> Path:
        """The file of snapshot number `seq`."""
        return self.snapshots / f'{seq}.json'

    @property
    def journals(self) -> tuple[Path, ...]:
        """Every `.jsonl` file of the run; registration creates them all, empty."""
        return (self.events, self.tool_effects, self.messages, self.snapshot_journal)


def is_run_directory_name(name: str) -> bool:
    """Whether `name`, found in the store's directory, can be a run's directory."""
    try:
        validate_path_safe_run_id(name)
    except ValueError:
        return False
    return True


def run_paths(root: Path, run_id: str) -> RunPaths:
    """The paths of run `run_id` under `root`; raises `TypeError` for a run id that is not a string and
    `ValueError` for one that is not path-safe."""
    require_text('run_id', run_id)
    return RunPaths(root / validate_path_safe_run_id(run_id))
