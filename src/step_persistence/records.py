"""The four record types every store persists, and their status vocabularies.

Records are immutable pydantic models. Every timestamp is a timezone-aware UTC
``datetime``: a naive one is rejected with ``ValueError`` and an aware non-UTC
one is converted to UTC, so ordering by timestamp is ordering by instant.

Importing this module does not import pydantic-ai (a process that reads no message, such as
`step-persistence runs list`, never pays for it): `ContinuableSnapshot` and `StepWrites` name
pydantic-ai's message types, which pydantic resolves when either model is first used
(validated, constructed, serialized, or its schema asked for). To use them as a field of
another pydantic model or in a `TypeAdapter`, import them from `step_persistence` (which
completes them) or call `ContinuableSnapshot.model_rebuild()` first.
"""

from __future__ import annotations

import functools
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated, Any, Literal, get_args

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, PrivateAttr

from step_persistence._history import EncodedMessage, encode_messages, history_digest

if TYPE_CHECKING:
    from pydantic_ai.messages import ModelMessage

__all__ = [
    'ContinuableSnapshot',
    'ConversationSummary',
    'EventKind',
    'OriginKind',
    'RunOrigin',
    'RunRecord',
    'RunStatus',
    'SnapshotRef',
    'SnapshotState',
    'StepEvent',
    'TokenUsage',
    'ToolEffectRecord',
    'ToolEffectStatus',
    'require_utc',
    'utc_now',
]

EventKind = Literal[
    'run_started',
    'run_completed',
    'run_failed',
    'model_request_started',
    'model_request_completed',
    'model_request_failed',
    'tool_call_started',
    'tool_call_completed',
    'tool_call_failed',
]
"""What happened at one step boundary."""

SnapshotState = Literal['complete', 'interrupted']
"""`complete`: every tool call in the history has its result; `interrupted`: some tool work was unsettled."""

ToolEffectStatus = Literal['started', 'completed', 'failed']
"""Ledger status of one tool call; `started` after a crash means the side effect may or may not have happened."""

EVENT_KINDS: frozenset[str] = frozenset(get_args(EventKind))
SNAPSHOT_STATES: frozenset[str] = frozenset(get_args(SnapshotState))
TOOL_EFFECT_STATUSES: frozenset[str] = frozenset(get_args(ToolEffectStatus))

RunStatus = Literal['running', 'completed', 'failed', 'crashed']
"""What state a run is in (derived by `step_persistence.status.run_status`, never stored).

`crashed`: no terminal event, and either a tool call left unresolved or no event for `stale_after`.
"""

RUN_STATUSES: frozenset[str] = frozenset(get_args(RunStatus))


def utc_now() -> datetime:
    """The current instant as an aware UTC datetime."""
    return datetime.now(UTC)


def require_utc(value: datetime) -> datetime:
    """Return `value` converted to UTC; raise `ValueError` if it is naive."""
    if value.tzinfo is None or value.tzinfo.utcoffset(value) is None:
        raise ValueError(f'naive datetime {value.isoformat()} is not allowed: pass a timezone-aware datetime')
    return value.astimezone(UTC)


UtcDatetime = Annotated[datetime, AfterValidator(require_utc)]
Metadata = dict[str, str]


def _define_message_types() -> None:
    """Bind pydantic-ai's `ModelMessage` in this module, where pydantic resolves the records' annotations."""
    global ModelMessage
    from pydantic_ai.messages import ModelMessage


class _Record(BaseModel):
    """Every record; each builds its validator on first use, so a process builds only those it uses."""

    model_config = ConfigDict(frozen=True, extra='forbid', strict=False, defer_build=True)


class _NamesMessages(_Record):
    """A record whose fields name pydantic-ai's message types (see the module's docstring)."""

    @classmethod
    def model_rebuild(cls, **kwargs: Any) -> bool | None:
        """Complete the model, importing pydantic-ai's message types first; pydantic calls this on the
        model's first use."""
        _define_message_types()
        return super().model_rebuild(**kwargs)


OriginKind = Literal['continued', 'forked']
"""How a run's initial history relates to the stored snapshot it came from.

`continued`: the run carries that snapshot's line on (at most one run per snapshot is stored as
its continuation); `forked`: the run branches from it (`fork_run`, or a second run continuing the
same snapshot, such as a second browser tab).
"""

ORIGIN_KINDS: frozenset[str] = frozenset(get_args(OriginKind))


class RunOrigin(_Record):
    """The stored snapshot a run's initial history was: set when the run started from it."""

    kind: OriginKind
    run_id: str
    """The run the snapshot belongs to."""
    seq: int
    """The snapshot's `seq` in that run."""


class SnapshotRef(_Record):
    """Names one stored snapshot."""

    run_id: str
    seq: int


class RunRecord(_Record):
    """One agent run and its lineage."""

    run_id: str
    conversation_id: str | None = None
    """The sequence of runs this one belongs to (pydantic-ai's `conversation_id`)."""
    parent_run_id: str | None = None
    """The run that delegated this one, if any."""
    agent_name: str | None = None
    metadata: Metadata = Field(default_factory=dict)
    started_at: UtcDatetime = Field(default_factory=utc_now)
    origin: RunOrigin | None = None
    """The stored snapshot this run continued or forked from (`None`: it started from no stored history)."""


class ConversationSummary(_Record):
    """One conversation: the runs sharing a `conversation_id`."""

    conversation_id: str
    first_started_at: UtcDatetime
    last_started_at: UtcDatetime
    run_count: int
    head_run_id: str
    """The newest run (latest `started_at`, ties in registration order): where the next turn continues."""


TOKEN_COUNT_MAX = 2**63 - 1
"""The largest token count a record holds: what every backend stores as a number (a SQL `BIGINT`, a BSON int64)."""

TokenCount = Annotated[int, Field(ge=0, le=TOKEN_COUNT_MAX, strict=True)]
"""A number of tokens: an `int` (not a `bool`, float or numeric string) from 0 to `TOKEN_COUNT_MAX`."""


class TokenUsage(_Record):
    """The tokens one model response used, as the model reported them (pydantic-ai's `RequestUsage`).

    `input_tokens` includes the cached ones (`cache_read_tokens`, `cache_write_tokens`), as in pydantic-ai.
    """

    input_tokens: TokenCount
    output_tokens: TokenCount
    cache_read_tokens: TokenCount
    """Input tokens read from the provider's prompt cache."""
    cache_write_tokens: TokenCount
    """Input tokens written to the provider's prompt cache."""


class StepEvent(_Record):
    """One append-only entry of a run's event log."""

    run_id: str
    kind: EventKind
    step_index: int
    timestamp: UtcDatetime = Field(default_factory=utc_now)
    conversation_id: str | None = None
    parent_run_id: str | None = None
    agent_name: str | None = None
    tool_call_id: str | None = None
    tool_name: str | None = None
    error: str | None = None
    """`repr()` of the exception, on failure events."""
    metadata: Metadata = Field(default_factory=dict)
    idempotency_key: str | None = None
    """When set, a second event of the same run with this exact key is not written."""
    model_name: Annotated[str | None, Field(strict=True)] = None
    """The model that answered (`ModelResponse.model_name`), on the event ending a model request that got a response."""
    usage: TokenUsage | None = None
    """The tokens of that response (`ModelResponse.usage`), on the event ending a model request that got one
    (`model_request_completed`, or `model_request_failed` for a response cut short); `None` on every other event."""


class ContinuableSnapshot(_NamesMessages):
    """The run's message history at one settled point, ready for `Agent.run(message_history=...)`."""

    run_id: str
    step_index: int
    messages: list[ModelMessage]
    conversation_id: str | None = None
    parent_run_id: str | None = None
    agent_name: str | None = None
    timestamp: UtcDatetime = Field(default_factory=utc_now)
    state: SnapshotState = 'complete'
    idempotency_key: str | None = None
    """When set, a second snapshot of the same run with this exact key is not written, even after pruning."""
    seq: int | None = None
    """The store-assigned per-run sequence number; `None` on a snapshot not read from a store."""

    _encoded: tuple[EncodedMessage, ...] | None = PrivateAttr(default=None)

    def __eq__(self, other: object) -> bool:
        """Equal when every field but the store-assigned `seq` is, the messages compared by their JSON:
        a snapshot read back equals the one saved (pydantic-ai reads a `BinaryContent` back as its
        `BinaryImage` subclass, equal in JSON)."""
        if not isinstance(other, ContinuableSnapshot):
            return NotImplemented
        unassigned = {'seq': None, 'messages': None}
        return {**self.__dict__, **unassigned} == {**other.__dict__, **unassigned} and [
            message.digest for message in self.encoded_messages()
        ] == [message.digest for message in other.encoded_messages()]

    __hash__ = None  # type: ignore[assignment]  # a history is a list: snapshots are not hashable

    @classmethod
    def from_encoded(
        cls,
        *,
        run_id: str,
        step_index: int,
        messages: list[ModelMessage],
        encoded: tuple[EncodedMessage, ...],
        state: SnapshotState,
        conversation_id: str | None,
        parent_run_id: str | None,
        agent_name: str | None,
        idempotency_key: str | None,
    ) -> ContinuableSnapshot:
        """Build a snapshot whose messages are already encoded, without re-validating the history.

        `encoded` must be the encoding of `messages`; stores then write it instead of serializing
        the whole history again. (A copy of one constructed snapshot with every field replaced: a
        third of what `model_construct` costs, once per step.)
        """
        snapshot = _blank_snapshot().model_copy(
            update={
                'run_id': run_id,
                'step_index': step_index,
                'messages': messages,
                'conversation_id': conversation_id,
                'parent_run_id': parent_run_id,
                'agent_name': agent_name,
                'timestamp': utc_now(),
                'state': state,
                'idempotency_key': idempotency_key,
                'seq': None,
            }
        )
        snapshot._encoded = encoded
        return snapshot

    def encoded_messages(self) -> tuple[EncodedMessage, ...]:
        """The messages as JSON, reusing the encoding the capability already made when there is one."""
        if self._encoded is None:
            self._encoded = encode_messages(self.messages)
        return self._encoded

    def history_digest(self) -> str:
        """The digest of the whole history (`_history.history_digest`), by which a kept history is recognised."""
        return history_digest(message.digest for message in self.encoded_messages())


@functools.cache
def _blank_snapshot() -> ContinuableSnapshot:
    """The snapshot `ContinuableSnapshot.from_encoded` copies, every field of which it replaces."""
    return ContinuableSnapshot.model_construct(run_id='', step_index=0, messages=[])


class ToolEffectRecord(_Record):
    """The ledger entry of one tool call, keyed by `(run_id, tool_call_id)`."""

    run_id: str
    tool_call_id: str
    tool_name: str
    status: ToolEffectStatus
    started_at: UtcDatetime = Field(default_factory=utc_now)
    ended_at: UtcDatetime | None = None
    idempotency_key: str | None = None
    """A caller-chosen key for the external side effect, to deduplicate it on replay."""
    effect_summary: str | None = None
    """What the tool did (or why it failed), for whoever decides whether to redo it."""


class StepWrites(_NamesMessages):
    """Writes that a store applies together: tool effects, then events, then snapshots, each in list order.

    Applying it must have exactly the effect of the individual calls in that order
    (`record_tool_effect`, `append_event`, `save_snapshot`); a store that can, applies them in one
    transaction, so a crash keeps all of them or none.
    """

    tool_effects: list[ToolEffectRecord] = Field(default_factory=list)
    events: list[StepEvent] = Field(default_factory=list)
    snapshots: list[ContinuableSnapshot] = Field(default_factory=list)

    def is_empty(self) -> bool:
        return not (self.tool_effects or self.events or self.snapshots)


def merge_tool_effect(stored: ToolEffectRecord | None, new: ToolEffectRecord) -> ToolEffectRecord:
    """The record an upsert of `new` over `stored` leaves: `new`, keeping stored annotations it leaves null."""
    if stored is None:
        return new
    kept = {
        name: getattr(stored, name)
        for name in ('idempotency_key', 'effect_summary')
        if getattr(new, name) is None and getattr(stored, name) is not None
    }
    return new.model_copy(update=kept) if kept else new
