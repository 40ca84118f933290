"""`list_runs` and `list_conversations` over records in memory, for stores that hold or index them.

The SQL and MongoDB stores answer the same questions with indexed queries; the in-memory store
and the file store's index answer them here, with the same argument checks and the same order.
`stored_snapshot_state` checks a state those two stores read for `list_snapshot_states`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from step_persistence._arguments import require_limit, require_text
from step_persistence.records import SNAPSHOT_STATES, ConversationSummary, RunRecord, SnapshotState

__all__ = ['ConversationFilter', 'RunFilter', 'conversation_summaries', 'run_order', 'stored_snapshot_state']


def stored_snapshot_state(value: object) -> SnapshotState:
    """`value` (a snapshot's stored state) if it is one of `SnapshotState`'s; `ValueError` otherwise."""
    if not isinstance(value, str) or value not in SNAPSHOT_STATES:
        raise ValueError(f'not a snapshot state: {value!r}')
    return value  # type: ignore[return-value]


def run_order(record: RunRecord, registration: int) -> tuple[object, int]:
    """The `list_runs` order of a run: `started_at`, ties in registration order."""
    return (record.started_at, registration)


@dataclass(frozen=True)
class RunFilter:
    """The arguments of `list_runs`, checked."""

    parent_run_id: str | None = None
    conversation_id: str | None = None
    agent_name: str | None = None
    origin_run_id: str | None = None
    run_id_prefix: str | None = None
    limit: int | None = None
    newest_first: bool = False

    def __post_init__(self) -> None:
        for name in ('parent_run_id', 'conversation_id', 'agent_name', 'origin_run_id', 'run_id_prefix'):
            require_text(name, getattr(self, name), optional=True)
        require_limit(self.limit)
        if not isinstance(self.newest_first, bool):
            raise TypeError(f'newest_first must be a bool, not {type(self.newest_first).__name__}')

    def matches(self, record: RunRecord) -> bool:
        return (
            (self.parent_run_id is None or record.parent_run_id == self.parent_run_id)
            and (self.conversation_id is None or record.conversation_id == self.conversation_id)
            and (self.agent_name is None or record.agent_name == self.agent_name)
            and (
                self.origin_run_id is None or (record.origin is not None and record.origin.run_id == self.origin_run_id)
            )
            and self.admits_run_id(record.run_id)
        )

    def admits_run_id(self, run_id: str) -> bool:
        """Whether `run_id_prefix` (if given) starts `run_id`: a test on the id alone, before a record is read."""
        return self.run_id_prefix is None or run_id.startswith(self.run_id_prefix)

    def select(self, runs: Iterable[tuple[RunRecord, int]]) -> list[RunRecord]:
        """The matching records of `(record, registration)` pairs, in order, limited."""
        ordered = sorted((pair for pair in runs if self.matches(pair[0])), key=lambda pair: run_order(*pair))
        if self.newest_first:
            ordered.reverse()
        return [record for record, _ in ordered[: self.limit]]


@dataclass(frozen=True)
class ConversationFilter:
    """The arguments of `list_conversations`, checked."""

    limit: int | None = None
    newest_first: bool = True
    agent_name: str | None = None

    def __post_init__(self) -> None:
        require_limit(self.limit)
        if not isinstance(self.newest_first, bool):
            raise TypeError(f'newest_first must be a bool, not {type(self.newest_first).__name__}')
        require_text('agent_name', self.agent_name, optional=True)


def conversation_summaries(
    runs: Iterable[tuple[RunRecord, int]], chosen: ConversationFilter
) -> list[ConversationSummary]:
    """`list_conversations` over `(record, registration)` pairs."""
    agent_name, newest_first = chosen.agent_name, chosen.newest_first
    grouped: dict[str, list[tuple[RunRecord, int]]] = {}
    for record, registration in runs:
        if record.conversation_id is None or (agent_name is not None and record.agent_name != agent_name):
            continue
        grouped.setdefault(record.conversation_id, []).append((record, registration))
    summaries = []
    for conversation_id, members in grouped.items():
        members.sort(key=lambda pair: run_order(*pair))
        summaries.append(
            ConversationSummary(
                conversation_id=conversation_id,
                first_started_at=members[0][0].started_at,
                last_started_at=members[-1][0].started_at,
                run_count=len(members),
                head_run_id=members[-1][0].run_id,
            )
        )
    summaries.sort(key=lambda summary: (summary.last_started_at, summary.conversation_id), reverse=newest_first)
    return summaries[: chosen.limit]
