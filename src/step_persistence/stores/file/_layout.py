"""Where everything of a `FileStepStore` lives on disk.

```
<directory>/
  <run_id>/                   one directory per run (run ids are validated path-safe names)
    run.json                  the RunRecord itself (origin included)
    registration.json         its registration stamp, ordering runs registered at the same instant
    run.lock                  lock file (fcntl.flock); holds the run's incarnation token
    events.jsonl              one StepEvent per line, append order
    tool_effects.jsonl        one merged ToolEffectRecord per line; the last line of a call wins
    snapshots.jsonl           journal of saved snapshots (seq, state, key, view): the commit point
    snapshots/<seq>.json      one snapshot header plus its view: line, length, through, history digest
    messages.jsonl            only in runs written before history lines: the run's own messages
  @lines/<line_id>/           one directory per history line (a fresh random id, never reused)
    line.json                 the line's base (the view it branches from, or none), written first
    line.lock                 the line's lock; holds a token replaced when its messages are compacted
    messages.jsonl            every version of every history position of the line, once, numbered
    users/<run_id>.<token>    one empty file per run registration that saved a snapshot on the line
    children/<line_id>        one empty file per line branching from this one
  @conversations/<key>/       per conversation (`key`: the SHA-256 of its id, never the raw id)
    conversation.json         the conversation id
    conversation.lock         serializes changes to the conversation's index
    runs/<entry>              a hard link to each run's run.json (`entry` sorts by start)
    agents/<key>/<entry>      the same, for the runs of one agent (`key`: the SHA-256 of its name)
    latest.<scope>            the start its marker in @latest/<scope>/ is named by
  @latest/<scope>/<start>.<key>   per conversation (scope `all`) or per agent in it: named by its newest start
  @runs/                      the store-wide run index
    all/<entry>               a hard link to each run's run.json (`entry` sorts by start)
    agents/<key>/<entry>      the same, for the runs of one agent (`key`: the SHA-256 of its name)
    parents/<key>/<entry>     the same, for the runs delegated from one run (`key`: SHA-256 of its id)
    origins/<key>/<entry>     the same, for the runs continuing or forking one run's snapshots
    complete                  present once the run index covers every run
  @origins/<key>              per continued snapshot (`key`: SHA-256 of run id and seq): the run continuing it
  @indexed                    present once the conversation index covers every run
  @media/                     media blobs of the default DiskMediaStore
  @durable/<key>/             per durable workflow: its journal (`journal.py`; `key`: the SHA-256 of its id)
  @tmp/                       staging of registrations, lines and deleted runs
```

Store-owned names contain `@`, which no valid run id can contain, so a run can never shadow them.
Nothing a caller chose except a validated run id becomes a path component: conversation ids,
agent names and origins are hashed, line ids are the store's own.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from step_persistence._arguments import require_text
from step_persistence.run_ids import validate_path_safe_run_id

__all__ = [
    'ALL_AGENTS',
    'CONVERSATIONS_DIRECTORY_NAME',
    'INDEXED_MARKER_NAME',
    'LATEST_DIRECTORY_NAME',
    'LINES_DIRECTORY_NAME',
    'MEDIA_DIRECTORY_NAME',
    'ORIGINS_DIRECTORY_NAME',
    'RESERVED_NAMES',
    'RUNS_DIRECTORY_NAME',
    'RUN_FILE_NAME',
    'WORK_DIRECTORY_NAME',
    'ConversationPaths',
    'Entry',
    'LinePaths',
    'RunIndexPaths',
    'RunPaths',
    'is_run_directory_name',
    'line_paths',
    'require_line_id',
    'run_paths',
    'start_of',
    'started_at_of',
    'text_key',
]

MEDIA_DIRECTORY_NAME = '@media'
"""Directory under the store's root where the default media store keeps its blobs."""
WORK_DIRECTORY_NAME = '@tmp'
"""Directory under the store's root where registrations and lines are staged and deleted runs removed."""
LINES_DIRECTORY_NAME = '@lines'
DURABLE_DIRECTORY_NAME = '@durable'
"""The durable journal (`journal.py`): one directory per workflow, named by the SHA-256 of its id."""
JOURNAL_UNITS_FILE_NAME = 'units.jsonl'
CONVERSATIONS_DIRECTORY_NAME = '@conversations'
LATEST_DIRECTORY_NAME = '@latest'
ORIGINS_DIRECTORY_NAME = '@origins'
INDEXED_MARKER_NAME = '@indexed'
RUNS_DIRECTORY_NAME = '@runs'
RESERVED_NAMES = frozenset(
    {
        MEDIA_DIRECTORY_NAME,
        WORK_DIRECTORY_NAME,
        LINES_DIRECTORY_NAME,
        CONVERSATIONS_DIRECTORY_NAME,
        LATEST_DIRECTORY_NAME,
        ORIGINS_DIRECTORY_NAME,
        INDEXED_MARKER_NAME,
        RUNS_DIRECTORY_NAME,
        DURABLE_DIRECTORY_NAME,
    }
)
RUN_FILE_NAME = 'run.json'
"""A run's record, in its directory."""
ALL_AGENTS = 'all'
"""The scope of an index over all its runs (an agent's scope is a 64-digit hex key)."""

_LINE_ID = re.compile(r'[0-9a-f]{32}')


def text_key(text: str) -> str:
    """The path component standing for `text` (a conversation id, an agent name): its SHA-256, in hex."""
    return hashlib.sha256(text.encode('utf-8', 'surrogatepass')).hexdigest()


def require_line_id(value: object) -> str:
    """`value` if it is a line id the store makes (32 lowercase hex digits); else `ValueError`.

    Line ids are read back from snapshot files and become path components: anything else (`..`, a
    path) is damage, never followed.
    """
    if not isinstance(value, str) or not _LINE_ID.fullmatch(value):
        raise ValueError(f'not a history line id: {value!r}')
    return value


_EPOCH = datetime(1, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


def start_of(started_at: datetime) -> int:
    """`started_at` as a non-negative integer (microseconds since year 1) that sorts like the instant."""
    return (started_at - _EPOCH) // _MICROSECOND


def started_at_of(start: int) -> datetime:
    """The instant `start_of` made `start` from."""
    return _EPOCH + start * _MICROSECOND


@dataclass(frozen=True, order=True)
class Entry:
    """A run in an index: its start, registration stamp and id, in `list_runs` order."""

    start: int
    registered_ns: int
    run_id: str

    @property
    def name(self) -> str:
        """The entry's file name: fixed-width numbers first, so names sort as entries do."""
        return f'{self.start:019d}.{self.registered_ns:020d}.{self.run_id}'

    @classmethod
    def parse(cls, name: str) -> Entry | None:
        """The entry a file name holds; `None` for a name the store did not write."""
        start, _, rest = name.partition('.')
        registered, _, run_id = rest.partition('.')
        if not (len(start) == 19 and start.isdigit() and len(registered) == 20 and registered.isdigit()):
            return None
        if not is_run_directory_name(run_id):
            return None
        return cls(int(start), int(registered), run_id)


@dataclass(frozen=True)
class RunPaths:
    """The paths of one run's files."""

    directory: Path

    @property
    def run_file(self) -> Path:
        return self.directory / RUN_FILE_NAME

    @property
    def registration_file(self) -> Path:
        """The run's registration stamp (runs written before issue 19 keep it in `run.json`)."""
        return self.directory / 'registration.json'

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
    def legacy_messages(self) -> Path:
        """The run's own `messages.jsonl`, in runs written before history lines (never written now)."""
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
        """Every `.jsonl` file of a run; registration creates them all, empty."""
        return (self.events, self.tool_effects, self.snapshot_journal)


@dataclass(frozen=True)
class LinePaths:
    """The paths of one history line's files."""

    directory: Path

    @property
    def line_id(self) -> str:
        return self.directory.name

    @property
    def base_file(self) -> Path:
        return self.directory / 'line.json'

    @property
    def lock_file(self) -> Path:
        return self.directory / 'line.lock'

    @property
    def messages(self) -> Path:
        return self.directory / 'messages.jsonl'

    @property
    def users(self) -> Path:
        return self.directory / 'users'

    def user(self, run_id: str, incarnation: str) -> Path:
        """The marker saying that registration `incarnation` of run `run_id` saved a snapshot on the line."""
        return self.users / f'{run_id}.{incarnation}'

    @property
    def children(self) -> Path:
        return self.directory / 'children'

    def child(self, line_id: str) -> Path:
        return self.children / line_id


@dataclass(frozen=True)
class ConversationPaths:
    """The paths of one conversation's index."""

    directory: Path

    @property
    def key(self) -> str:
        return self.directory.name

    @property
    def id_file(self) -> Path:
        return self.directory / 'conversation.json'

    @property
    def lock_file(self) -> Path:
        return self.directory / 'conversation.lock'

    def entries(self, scope: str) -> Path:
        """The directory of the entries of `scope` (`ALL_AGENTS`, or an agent's key)."""
        return self.directory / 'runs' if scope == ALL_AGENTS else self.directory / 'agents' / scope

    def latest(self, scope: str) -> Path:
        """The file naming the start `scope`'s marker in `@latest/<scope>/` carries."""
        return self.directory / f'latest.{scope}'


@dataclass(frozen=True)
class RunIndexPaths:
    """The paths of the store-wide run index (`@runs`)."""

    directory: Path

    @property
    def every_run(self) -> Path:
        """The entries of every run."""
        return self.directory / ALL_AGENTS

    def of_agent(self, agent_name: str) -> Path:
        """The entries of the runs of `agent_name`."""
        return self.directory / 'agents' / text_key(agent_name)

    def of_parent(self, run_id: str) -> Path:
        """The entries of the runs delegated from run `run_id`."""
        return self.directory / 'parents' / text_key(run_id)

    def of_origin(self, run_id: str) -> Path:
        """The entries of the runs that continued or forked a snapshot of run `run_id`."""
        return self.directory / 'origins' / text_key(run_id)

    @property
    def complete_marker(self) -> Path:
        """Present once the run index covers every run of the store."""
        return self.directory / 'complete'


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


def line_paths(root: Path, line_id: str) -> LinePaths:
    """The paths of line `line_id` under `root`; `ValueError` for an id the store never makes."""
    return LinePaths(root / LINES_DIRECTORY_NAME / require_line_id(line_id))
