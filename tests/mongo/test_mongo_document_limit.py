"""MongoDB's 16 MiB document limit: large parts go to the media store; what is still too large fails cleanly."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

import pytest
from pydantic_ai.messages import ModelRequest, UserPromptPart

from step_persistence import ContinuableSnapshot, RunRecord
from step_persistence.stores.mongo import MAX_DOCUMENT_BYTES
from support.mongo_helpers import scratch, store_in
from support.servers.mongo import Scratch

__all__ = ['scratch']

pytestmark = pytest.mark.anyio
MIB = 1024 * 1024
T0 = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


def prompt(*contents: str) -> ContinuableSnapshot:
    message = ModelRequest(parts=[UserPromptPart(content=content, timestamp=T0) for content in contents])
    return ContinuableSnapshot(run_id='big', step_index=1, messages=[message])


async def state_of(scratch: Scratch, database: str) -> tuple[Any, ...]:
    db = scratch.client[database]
    counters = await db['counters'].find_one({'_id': 'big'}, {'_id': 0, 'registration': 0})
    return (counters, await db['messages'].count_documents({}), await db['snapshots'].count_documents({}))


async def test_a_message_fits_up_to_the_limit_and_fails_one_byte_over(scratch: Scratch) -> None:
    database = scratch.fresh_database()
    store = store_in(scratch, database, media_store=None)
    await store.register_run(RunRecord(run_id='big'))
    await store.save_snapshot(prompt('small'))

    with pytest.raises(ValueError, match='16 MiB') as raised:
        await store.save_snapshot(prompt('x' * (16 * MIB)))
    assert "run 'big'" in str(raised.value)
    size = int(re.search(r'would be a (\d+)-byte document', str(raised.value)).group(1))  # type: ignore[union-attr]
    fitting = 16 * MIB - (size - 16 * MIB)

    before = await state_of(scratch, database)
    with pytest.raises(ValueError, match=f'{MAX_DOCUMENT_BYTES + 1}-byte document'):
        await store.save_snapshot(prompt('y' * (fitting + 1)))
    assert await state_of(scratch, database) == before, 'a rejected snapshot writes nothing'

    await store.save_snapshot(prompt('z' * fitting))
    latest = await store.latest_snapshot(run_id='big')
    assert latest is not None and latest.seq == 2
    [part] = latest.messages[0].parts
    assert isinstance(part, UserPromptPart) and part.content == 'z' * fitting


async def test_large_parts_go_to_the_media_store_and_many_small_ones_still_fail(scratch: Scratch) -> None:
    database = scratch.fresh_database()
    store = store_in(scratch, database)
    await store.register_run(RunRecord(run_id='big'))
    await store.save_snapshot(prompt('é' * (9 * MIB)))
    latest = await store.latest_snapshot(run_id='big')
    assert latest is not None and latest.messages[0].parts[0].content == 'é' * (9 * MIB)  # type: ignore[union-attr]
    manifest = await scratch.client[database]['media'].find_one({})
    assert (manifest['size'], manifest['chunks']) == (18 * MIB, 3)

    before = await state_of(scratch, database)
    below_threshold = 'w' * (60 * 1024)
    with pytest.raises(ValueError, match=r'16 MiB.*media_threshold_bytes'):
        await store.save_snapshot(prompt(*[below_threshold] * 290))
    assert await state_of(scratch, database) == before


async def test_an_oversized_run_record_is_not_registered(scratch: Scratch) -> None:
    store = store_in(scratch)
    with pytest.raises(ValueError, match=r"the run record of run 'huge' .* 16 MiB"):
        await store.register_run(RunRecord(run_id='huge', metadata={'blob': 'b' * (17 * MIB)}))
    assert await store.get_run(run_id='huge') is None
