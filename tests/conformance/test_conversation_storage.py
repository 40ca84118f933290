"""A chat stores each of its messages once on every durable backend, however many turns it has.

Each turn is a new run given the previous run's history (as a chat application keeps it), so
without sharing the stored history every run would store the whole conversation again
(quadratic growth). Counted in the storage itself (`BackendSession.count_stored_messages`).
"""

from __future__ import annotations

import pytest

from step_persistence import StepStore
from support.backends import BackendSession
from support.chat import chat_agent, chat_turns

pytestmark = pytest.mark.anyio


async def distinct_messages(store: StepStore) -> int:
    """Distinct message encodings among every snapshot of every run."""
    digests: set[str] = set()
    for run in await store.list_runs():
        for snapshot in await store.list_snapshots(run_id=run.run_id, include_interrupted=True):
            digests.update(message.digest for message in snapshot.encoded_messages())
    return len(digests)


@pytest.mark.parametrize('turns', [10, 40])
async def test_a_chat_stores_each_message_once(durable_session: BackendSession, turns: int) -> None:
    count = durable_session.count_stored_messages
    assert count is not None, 'a durable backend counts its stored messages'
    store = await durable_session.make()
    history = await chat_turns(chat_agent(store), turns)
    assert len(history) == 4 * turns
    assert await distinct_messages(store) == len(history)
    assert await count() == len(history)
