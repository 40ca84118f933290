"""`MongoStepStore(client=... | db_url=..., database=...)` as the seed builds it (issue 19, item 3):
parts of at least `media_threshold_bytes` (64 KiB by default) go to a `MongoMediaStore` on the same
client and database."""

from __future__ import annotations

import pytest
from pydantic_ai.messages import ModelMessage, ModelMessagesTypeAdapter, ModelRequest, UserPromptPart

from step_persistence import ContinuableSnapshot, MongoStepStore, RunRecord
from step_persistence.media import MongoMediaStore, media_uri_for
from support.mongo_helpers import scratch
from support.servers.mongo import MongoServer, Scratch

__all__ = ['scratch']

pytestmark = pytest.mark.anyio


def history(*texts: str) -> list[ModelMessage]:
    return [ModelRequest(parts=[UserPromptPart(content=text)]) for text in texts]


def dump(messages: list[ModelMessage]) -> bytes:
    return ModelMessagesTypeAdapter.dump_json(messages)


async def test_a_shared_client_and_its_default_media_store(scratch: Scratch) -> None:
    database = scratch.fresh_database()
    store = MongoStepStore(client=scratch.client, database=database)
    assert store.client is scratch.client and store.media_threshold_bytes == 64 * 1024
    assert isinstance(store.media_store, MongoMediaStore)
    messages = history('small', 'a' * (64 * 1024 - 1), 'b' * 64 * 1024)
    await store.register_run(RunRecord(run_id='r'))
    await store.save_snapshot(ContinuableSnapshot(run_id='r', step_index=1, messages=messages))
    manifests = await scratch.client[database]['media'].find({}, {'_id': 1}).to_list()
    assert manifests == [{'_id': media_uri_for(b'b' * 64 * 1024).removeprefix('media+sha256://')}]
    latest = await store.latest_snapshot(run_id='r')
    assert latest is not None and dump(latest.messages) == dump(messages)
    await store.aclose()
    assert (await scratch.client.admin.command('ping'))['ok'] == 1, 'a shared client stays open'


async def test_a_connection_string_and_a_threshold(mongo_server: MongoServer, scratch: Scratch) -> None:
    database = scratch.fresh_database()
    async with MongoStepStore(db_url=mongo_server.uri, database=database, media_threshold_bytes=1024) as store:
        messages = history('c' * 1024)
        await store.register_run(RunRecord(run_id='r'))
        await store.save_snapshot(ContinuableSnapshot(run_id='r', step_index=1, messages=messages))
        latest = await store.latest_snapshot(run_id='r')
        assert latest is not None and dump(latest.messages) == dump(messages)
    assert await scratch.client[database]['media'].count_documents({}) == 1
