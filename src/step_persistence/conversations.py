"""Conversations: the runs sharing a `conversation_id`, continued turn after turn."""

from __future__ import annotations

from pydantic_ai.messages import ModelMessage

from step_persistence._arguments import require_text
from step_persistence.origins import tag_history
from step_persistence.protocol import StepStore
from step_persistence.records import ContinuableSnapshot

__all__ = ['continue_conversation', 'delete_conversation', 'latest_conversation_snapshot']

_RUNS_PER_READ = 20


async def latest_conversation_snapshot(
    store: StepStore, *, conversation_id: str, include_interrupted: bool = False
) -> ContinuableSnapshot | None:
    """The newest snapshot of the conversation: that of its newest run holding one (only `complete`
    ones unless `include_interrupted`), or `None`."""
    require_text('conversation_id', conversation_id)
    seen = 0
    while True:
        runs = await store.list_runs(conversation_id=conversation_id, newest_first=True, limit=seen + _RUNS_PER_READ)
        for record in runs[seen:]:
            snapshot = await store.latest_snapshot(run_id=record.run_id, include_interrupted=include_interrupted)
            if snapshot is not None:
                return snapshot
        if len(runs) < seen + _RUNS_PER_READ:
            return None
        seen = len(runs)


async def continue_conversation(
    store: StepStore, *, conversation_id: str, include_interrupted: bool = False
) -> list[ModelMessage]:
    """The history to pass to the conversation's next turn: its newest run's newest `complete` snapshot.

    A newest run without one (it failed before its first settled step) is passed over for the run
    before it. The run given these messages is recorded as continuing that snapshot (or as a fork
    of it, when another run continued it already: a second browser tab). Raises `LookupError`
    when the conversation has no such snapshot.
    """
    snapshot = await latest_conversation_snapshot(
        store, conversation_id=conversation_id, include_interrupted=include_interrupted
    )
    if snapshot is None or snapshot.seq is None:
        wanted = 'snapshot' if include_interrupted else 'complete snapshot'
        raise LookupError(f'conversation {conversation_id!r} has no {wanted}')
    return tag_history(snapshot.messages, kind='continued', run_id=snapshot.run_id, seq=snapshot.seq)


async def delete_conversation(store: StepStore, *, conversation_id: str) -> list[str]:
    """Delete every run of the conversation, newest first; returns their ids.

    Messages that runs of another conversation share (a fork into a new conversation) stay with
    them. Runs delegated from these runs keep their own conversation and are not deleted.
    """
    require_text('conversation_id', conversation_id)
    runs = await store.list_runs(conversation_id=conversation_id, newest_first=True)
    for record in runs:
        await store.delete_run(run_id=record.run_id)
    return [record.run_id for record in runs]
