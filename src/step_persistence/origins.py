"""Where a run's initial history came from: the stored snapshot it continues or forks.

The helpers that read a history for the next run (`continue_run`, `fork_run`,
`continue_conversation`) tag what they return; a history the application kept itself (the
previous `result.all_messages()`) is recognised by its digest among its conversation's snapshots.
Either way the run's record gets a `RunOrigin`, and its store shares the origin's stored messages
instead of storing them again.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from dataclasses import dataclass

from pydantic_ai.messages import ModelMessage

from step_persistence._history import EncodedMessage, history_digest
from step_persistence.protocol import StepStore
from step_persistence.records import OriginKind, RunOrigin

__all__ = ['find_origin', 'tag_history', 'tagged_origin']


@dataclass(frozen=True, slots=True)
class _Tag:
    newest: weakref.ref[ModelMessage]
    length: int
    origin: RunOrigin


_TAGS: dict[int, _Tag] = {}
"""Tagged histories, by the identity of their newest message (entries leave with the message)."""


def tag_history(messages: list[ModelMessage], *, kind: OriginKind, run_id: str, seq: int) -> list[ModelMessage]:
    """Mark `messages` (as read from snapshot `seq` of `run_id`) as the start of a run that `kind`s it; returns them."""
    if not messages:
        return messages
    newest = messages[-1]
    key = id(newest)
    _TAGS[key] = _Tag(
        newest=weakref.ref(newest, lambda _: _TAGS.pop(key, None)),
        length=len(messages),
        origin=RunOrigin(kind=kind, run_id=run_id, seq=seq),
    )
    return messages


def tagged_origin(messages: Sequence[ModelMessage]) -> RunOrigin | None:
    """The origin a helper tagged `messages` with, if it is that very history (same newest message, same length)."""
    if not messages:
        return None
    tag = _TAGS.get(id(messages[-1]))
    if tag is None or tag.newest() is not messages[-1] or tag.length != len(messages):
        return None
    return tag.origin


async def find_origin(
    store: StepStore,
    messages: Sequence[ModelMessage],
    encoded: Sequence[EncodedMessage],
    *,
    conversation_id: str | None,
) -> RunOrigin | None:
    """The origin of a run starting from `messages` (`encoded`: their encoding): the helper's tag, or else
    the newest snapshot with the same history in the conversation the history's newest message
    belongs to (or `conversation_id`). `None` for an empty history, or one no store has.

    A store without `find_snapshot` (written before it was in the protocol) finds only tagged histories.
    """
    if not messages:
        return None
    tagged = tagged_origin(messages)
    if tagged is not None:
        return tagged
    find = getattr(store, 'find_snapshot', None)
    carried = next((m.conversation_id for m in reversed(messages) if m.conversation_id is not None), None)
    conversation = carried if carried is not None else conversation_id
    if find is None or conversation is None:
        return None
    found = await find(conversation_id=conversation, history_digest=history_digest(m.digest for m in encoded))
    return None if found is None else RunOrigin(kind='continued', run_id=found.run_id, seq=found.seq)
