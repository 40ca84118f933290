"""What each inspector page reads, through the `StepStore` protocol only, and how much.

Every read is bounded by the page, never by the store's size:

- **runs**: `list_runs(newest_first=True, limit=...)` with the store's own filters (agent,
  conversation), which the SQL and MongoDB stores answer from an index in order; a page of
  `size` runs then costs two reads per run shown (its events and unresolved effects, for its
  status). Filters the store cannot apply (status, text in the run id) look through at most `SCAN`
  runs per page and say where the next page goes on. Pages start at most `MAX_START` runs deep:
  beyond that, filter (the run-id text, agent or conversation) instead of paging.
- **a run**: its record, events, ledger and retained snapshots (the newest one's messages for the
  timeline), its parent chain (at most `MAX_ANCESTORS`), and at most `MAX_LINKS` delegates and
  continuations, each with its status.
- **conversations**: `list_conversations(limit=...)`, of every agent; one conversation is shown as a tree when it
  has at most `MAX_CONVERSATION_RUNS` runs (else its runs are listed page by page).

The file store answers `list_runs` from its run index (of every run, an agent, a parent, an origin)
or a conversation's, reading only the runs returned (docs/file-store.md); the other reads are per
run on every backend.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TypeVar

from step_persistence._arguments import require_text
from step_persistence.cli.lineage import ConversationRun, load_conversation
from step_persistence.inspector.messages import MessageView, message_views
from step_persistence.inspector.timeline import Timeline, build_timeline
from step_persistence.protocol import StepStore
from step_persistence.records import (
    RUN_STATUSES,
    ContinuableSnapshot,
    ConversationSummary,
    RunRecord,
    RunStatus,
    StepEvent,
    ToolEffectRecord,
    utc_now,
)
from step_persistence.status import run_status

__all__ = [
    'MAX_ANCESTORS',
    'MAX_CONVERSATION_RUNS',
    'MAX_LINKS',
    'MAX_PAGE_SIZE',
    'MAX_START',
    'PAGE_SIZE',
    'SCAN',
    'ConversationDetail',
    'ConversationsPage',
    'LineageLink',
    'RunDetail',
    'RunFilters',
    'RunRow',
    'RunState',
    'RunsPage',
    'SnapshotRow',
    'conversation_detail',
    'conversations_page',
    'find_snapshot',
    'run_detail',
    'run_state',
    'runs_page',
]

PAGE_SIZE = 50
MAX_PAGE_SIZE = 200
SCAN = 500
"""Runs a page with a status or run-id filter looks through, at most."""
MAX_START = 10_000
"""How deep in the newest-first order a page may start."""
MAX_ANCESTORS = 32
MAX_LINKS = 50
"""Delegates, and continuations, shown on a run's page."""
MAX_CONVERSATION_RUNS = 500
BATCH = 16
"""Runs read concurrently."""

Item = TypeVar('Item')
Read = TypeVar('Read')


async def _each(items: Sequence[Item], read: Callable[[Item], Awaitable[Read]]) -> list[Read]:
    """`read` of each item, in order, `BATCH` at a time."""
    found: list[Read] = []
    for begin in range(0, len(items), BATCH):
        found.extend(await asyncio.gather(*(read(item) for item in items[begin : begin + BATCH])))
    return found


def _check_page(start: object, size: object) -> None:
    for name, value, low, high in (('start', start, 0, MAX_START), ('size', size, 1, MAX_PAGE_SIZE)):
        if not isinstance(value, int) or isinstance(value, bool):
            raise TypeError(f'{name} must be an int, not {type(value).__name__}')
        if not low <= value <= high:
            raise ValueError(f'{name} must be between {low} and {high}, not {value}')


@dataclass(frozen=True)
class RunFilters:
    """The run list's filters; `None` (or empty text) applies none."""

    status: str | None = None
    agent: str | None = None
    conversation: str | None = None
    text: str | None = None
    """Text the run id contains (case-insensitive)."""

    def __post_init__(self) -> None:
        for name in ('status', 'agent', 'conversation', 'text'):
            require_text(name, getattr(self, name), optional=True)
        if self.status is not None and self.status not in RUN_STATUSES:
            raise ValueError(f'status must be one of {sorted(RUN_STATUSES)}, not {self.status!r}')

    @property
    def scans(self) -> bool:
        """Whether a filter is applied here rather than by the store (so a page looks through `SCAN` runs)."""
        return bool(self.status or self.text)


@dataclass(frozen=True)
class RunRow:
    """One run of the list: its record and what its events and ledger say."""

    record: RunRecord
    status: RunStatus
    ended_at: datetime | None
    steps: int
    """The highest step index of its events."""
    model_requests: int
    tool_calls: int
    unresolved: int
    input_tokens: int
    output_tokens: int
    """Token totals of its model requests, as their events recorded them."""

    @property
    def duration_seconds(self) -> float | None:
        return None if self.ended_at is None else (self.ended_at - self.record.started_at).total_seconds()


def _row(
    record: RunRecord, events: Sequence[StepEvent], unresolved: Sequence[ToolEffectRecord], now: datetime
) -> RunRow:
    terminal = next((e.timestamp for e in reversed(events) if e.kind in ('run_completed', 'run_failed')), None)
    return RunRow(
        record=record,
        status=run_status(events, unresolved, now=now),
        ended_at=terminal,
        steps=max((event.step_index for event in events), default=0),
        model_requests=sum(event.kind == 'model_request_started' for event in events),
        tool_calls=sum(event.kind == 'tool_call_started' for event in events),
        unresolved=len(unresolved),
        input_tokens=sum(event.usage.input_tokens for event in events if event.usage is not None),
        output_tokens=sum(event.usage.output_tokens for event in events if event.usage is not None),
    )


async def run_row(store: StepStore, record: RunRecord, *, now: datetime) -> RunRow:
    """The row of one run: two reads (events, unresolved effects)."""
    events = await store.list_events(run_id=record.run_id)
    return _row(record, events, await store.list_unresolved_tool_effects(run_id=record.run_id), now)


@dataclass(frozen=True)
class RunsPage:
    """One page of the run list."""

    rows: list[RunRow]
    start: int
    """Where the page started looking, in the newest-first order of the store's filters."""
    looked_through: int
    """How many runs from `start` the page looked at (its rows, or every run a scan examined)."""
    next_start: int | None
    """Where the next page starts; `None` on the last page (or at `MAX_START`)."""
    capped: bool
    """Whether more runs may match beyond `MAX_START`."""
    size: int


async def runs_page(
    store: StepStore, filters: RunFilters, *, start: int = 0, size: int = PAGE_SIZE, now: datetime | None = None
) -> RunsPage:
    """The runs matching `filters`, newest first, from position `start`: at most `size` of them.

    `TypeError`/`ValueError` for a `start` outside 0..`MAX_START` or a `size` outside
    1..`MAX_PAGE_SIZE`.
    """
    _check_page(start, size)
    moment = now or utc_now()
    window = SCAN if filters.scans else size + 1
    records = await store.list_runs(
        agent_name=filters.agent or None,
        conversation_id=filters.conversation or None,
        newest_first=True,
        limit=start + window,
    )
    candidates = list(enumerate(records[start:], start))
    if not filters.scans:
        shown = await _each([record for _, record in candidates[:size]], lambda r: run_row(store, r, now=moment))
        next_start = start + size if len(candidates) > size else None
        return _page(shown, start, len(shown), next_start, size)
    if filters.text:
        wanted = filters.text.casefold()
        candidates = [(at, record) for at, record in candidates if wanted in record.run_id.casefold()]
    rows: list[RunRow] = []
    for begin in range(0, len(candidates), BATCH):
        batch = candidates[begin : begin + BATCH]
        found = await _each([record for _, record in batch], lambda r: run_row(store, r, now=moment))
        for (at, _), row in zip(batch, found, strict=True):
            if filters.status and row.status != filters.status:
                continue
            if len(rows) == size:
                return _page(rows, start, at - start, at, size)
            rows.append(row)
    more = len(records) == start + window
    return _page(rows, start, len(records) - start, start + window if more else None, size)


def _page(rows: list[RunRow], start: int, looked: int, next_start: int | None, size: int) -> RunsPage:
    capped = next_start is not None and next_start > MAX_START
    return RunsPage(
        rows=rows,
        start=start,
        looked_through=looked,
        next_start=None if capped else next_start,
        capped=capped,
        size=size,
    )


@dataclass(frozen=True)
class LineageLink:
    """Another run related to the one shown: how, its status (`None` when it is not stored), and a snapshot."""

    run_id: str
    relation: str
    status: RunStatus | None
    agent_name: str | None = None
    seq: int | None = None
    """The snapshot an origin or a continuation started from."""


@dataclass(frozen=True)
class SnapshotRow:
    """One retained snapshot, with the lines that continue or fork from it."""

    seq: int
    step_index: int
    state: str
    timestamp: datetime
    messages: int
    continue_line: str
    fork_line: str


def _snapshot_row(snapshot: ContinuableSnapshot) -> SnapshotRow:
    seq = snapshot.seq if snapshot.seq is not None else -1
    interrupted = ', include_interrupted=True' if snapshot.state == 'interrupted' else ''
    arguments = f'store, run_id={snapshot.run_id!r}, seq={seq}{interrupted}'
    return SnapshotRow(
        seq=seq,
        step_index=snapshot.step_index,
        state=snapshot.state,
        timestamp=snapshot.timestamp,
        messages=len(snapshot.messages),
        continue_line=f'messages = await continue_run({arguments})',
        fork_line=f'messages = await fork_run({arguments})',
    )


@dataclass(frozen=True)
class RunState:
    """What the run page's refresh compares: when it changes, the page is fetched again."""

    status: RunStatus
    events: int
    unresolved: int

    @property
    def fingerprint(self) -> str:
        return f'{self.status}:{self.events}:{self.unresolved}'


@dataclass(frozen=True)
class RunDetail:
    """Everything a run's page shows."""

    record: RunRecord
    row: RunRow
    ancestors: list[LineageLink]
    """The delegation chain above the run, its root first."""
    delegates: list[LineageLink]
    more_delegates: bool
    origin: LineageLink | None
    continuations: list[LineageLink]
    more_continuations: bool
    timeline: Timeline
    effects: list[ToolEffectRecord]
    """Unresolved (`started`) first, then by start."""
    arguments: dict[str, str]
    """Tool call id -> the call's arguments, from the newest history."""
    snapshots: list[SnapshotRow]
    state: RunState
    """What the page's refresh compares with `run_state`."""


async def _status_of(store: StepStore, run_id: str, *, now: datetime) -> RunStatus:
    unresolved = await store.list_unresolved_tool_effects(run_id=run_id)
    return run_status(await store.list_events(run_id=run_id), unresolved, now=now)


async def _ancestors(store: StepStore, record: RunRecord) -> list[LineageLink]:
    chain: list[LineageLink] = []
    seen = {record.run_id}
    parent = record.parent_run_id
    while parent is not None and parent not in seen and len(chain) < MAX_ANCESTORS:
        seen.add(parent)
        found = await store.get_run(run_id=parent)
        chain.append(LineageLink(parent, 'parent', None, agent_name=None if found is None else found.agent_name))
        parent = None if found is None else found.parent_run_id
    return chain[::-1]


async def _links(store: StepStore, records: Sequence[RunRecord], *, now: datetime) -> list[LineageLink]:
    async def link(record: RunRecord) -> LineageLink:
        relation = 'delegate' if record.origin is None else f'{record.origin.kind} by'
        return LineageLink(
            record.run_id,
            relation,
            await _status_of(store, record.run_id, now=now),
            agent_name=record.agent_name,
            seq=None if record.origin is None else record.origin.seq,
        )

    return await _each(records, link)


async def run_detail(store: StepStore, run_id: str, *, now: datetime | None = None) -> RunDetail | None:
    """The run's page, or `None` when it is not stored."""
    require_text('run_id', run_id)
    moment = now or utc_now()
    record = await store.get_run(run_id=run_id)
    if record is None:
        return None
    events = await store.list_events(run_id=run_id)
    effects = await store.list_tool_effects(run_id=run_id)
    snapshots = await store.list_snapshots(run_id=run_id, include_interrupted=True)
    unresolved = [effect for effect in effects if effect.status == 'started']
    views: list[MessageView] = message_views(snapshots[-1].messages) if snapshots else []
    timeline = build_timeline(events, effects, views)
    delegates = await store.list_runs(parent_run_id=run_id, limit=MAX_LINKS + 1)
    went_on = await store.list_runs(origin_run_id=run_id, limit=MAX_LINKS + 1)
    origin = None
    if record.origin is not None:
        stored = await store.get_run(run_id=record.origin.run_id)
        origin = LineageLink(
            record.origin.run_id,
            f'{record.origin.kind} from',
            None if stored is None else await _status_of(store, stored.run_id, now=moment),
            agent_name=None if stored is None else stored.agent_name,
            seq=record.origin.seq,
        )
    row = _row(record, events, unresolved, moment)
    return RunDetail(
        record=record,
        row=row,
        ancestors=await _ancestors(store, record),
        delegates=await _links(store, delegates[:MAX_LINKS], now=moment),
        more_delegates=len(delegates) > MAX_LINKS,
        origin=origin,
        continuations=await _links(store, went_on[:MAX_LINKS], now=moment),
        more_continuations=len(went_on) > MAX_LINKS,
        timeline=timeline,
        effects=sorted(effects, key=lambda effect: (effect.status != 'started', effect.started_at)),
        arguments={
            part.tool_call_id: part.text
            for view in views
            for part in view.parts
            if part.kind == 'tool-call' and part.tool_call_id is not None
        },
        snapshots=[_snapshot_row(snapshot) for snapshot in snapshots],
        state=RunState(row.status, len(events), len(unresolved)),
    )


async def run_state(store: StepStore, run_id: str, *, now: datetime | None = None) -> RunState | None:
    """The run's state in two reads, or `None` when it is not stored."""
    require_text('run_id', run_id)
    if await store.get_run(run_id=run_id) is None:
        return None
    events = await store.list_events(run_id=run_id)
    unresolved = await store.list_unresolved_tool_effects(run_id=run_id)
    return RunState(run_status(events, unresolved, now=now or utc_now()), len(events), len(unresolved))


async def find_snapshot(store: StepStore, run_id: str, seq: int) -> ContinuableSnapshot | None:
    """The run's retained snapshot `seq` (of any state), or `None`."""
    require_text('run_id', run_id)
    snapshots = await store.list_snapshots(run_id=run_id, include_interrupted=True)
    return next((snapshot for snapshot in snapshots if snapshot.seq == seq), None)


@dataclass(frozen=True)
class ConversationsPage:
    rows: list[ConversationSummary]
    start: int
    next_start: int | None
    size: int


async def conversations_page(store: StepStore, *, start: int = 0, size: int = PAGE_SIZE) -> ConversationsPage:
    """Conversations, the one with the newest run first, from position `start` (bounds as `runs_page`).

    No agent filter: `list_conversations(agent_name=...)` sums up every run of the agent, a read as
    long as the agent's history (the run list filters by agent instead).
    """
    _check_page(start, size)
    found = await store.list_conversations(limit=start + size + 1, newest_first=True)
    rows = found[start : start + size]
    return ConversationsPage(rows, start, start + size if len(found) > start + size else None, size)


@dataclass(frozen=True)
class ConversationDetail:
    """One conversation: its runs as a tree of continuations and forks, or only their count when there are too many."""

    conversation_id: str
    runs: list[ConversationRun]
    """Oldest first; empty when there are more than `MAX_CONVERSATION_RUNS`."""
    too_many: bool

    def roots(self) -> list[ConversationRun]:
        return [run for run in self.runs if run.parent_id is None]

    def children(self, run: ConversationRun) -> list[ConversationRun]:
        by_id = {each.record.run_id: each for each in self.runs}
        return [by_id[child] for child in run.children if child in by_id]


async def conversation_detail(store: StepStore, conversation_id: str) -> ConversationDetail | None:
    """The conversation's page, or `None` when no run has this id."""
    require_text('conversation_id', conversation_id)
    first = await store.list_runs(conversation_id=conversation_id, limit=MAX_CONVERSATION_RUNS + 1)
    if not first:
        return None
    if len(first) > MAX_CONVERSATION_RUNS:
        return ConversationDetail(conversation_id, [], too_many=True)
    return ConversationDetail(conversation_id, await load_conversation(store, conversation_id), too_many=False)
