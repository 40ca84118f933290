"""Hypothesis-driven bad input on every backend: a clear error or an exact round trip, never damage elsewhere.

Each test keeps a sentinel run in the same store and checks after every example that it reads
back exactly as written. Examples are derandomized (the same on every machine) and few, to keep
the suite short; the per-backend tests in tests/file_store, tests/sql, tests/mongo and tests/media go
deeper on each backend.
"""

from __future__ import annotations

import string
from collections.abc import AsyncIterator
from typing import Any

import pytest
from hypothesis import strategies as st
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, ToolCallPart, ToolReturnPart

from step_persistence import (
    ContinuableSnapshot,
    FileStepStore,
    RunRecord,
    StepEvent,
)
from step_persistence.media.walker import DEFAULT_THRESHOLD_BYTES, MARKER_KEY, MARKER_VERSION
from step_persistence.testing.conformance import T0, sample_history
from support.backends import BACKENDS, BackendSession
from support.crash_ledger import fingerprint
from support.reliability_helpers import for_examples, write_sentinel

pytestmark = pytest.mark.anyio

BACKEND_NAMES = ['memory', 'file', 'sqlite', 'postgres', 'mongo']


@pytest.fixture(params=BACKEND_NAMES)
async def session(request: pytest.FixtureRequest) -> AsyncIterator[BackendSession]:
    async with BACKENDS[request.param].open(request) as opened:
        yield opened


# --- run ids ---

NASTY_RUN_IDS = [
    '',
    '.',
    '..',
    '../escape',
    'a/../../b',
    '/absolute',
    'a/b',
    'a\\b',
    'a\x00b',
    '\x00',
    'x' * 200,
    'x' * 201,
    'y' * 5000,
    '@media',
    '@tmp',
    'sentinel/../sentinel',
    'ünïcødé-日本-😀',
    '$where',
    'a.b',
    ' padded ',
    'line\nbreak',
    'CON',
]
run_ids = st.one_of(
    st.text(max_size=30),
    st.text(alphabet=string.ascii_letters + string.digits + '_.-', min_size=195, max_size=205),
)


async def test_run_ids_get_a_clear_error_or_an_exact_round_trip(session: BackendSession) -> None:
    store = await session.make()
    unchanged = await write_sentinel(store)
    outcomes: dict[str, int] = {'rejected': 0, 'stored': 0}

    async def check(run_id: str) -> None:
        if run_id == 'sentinel':
            return
        try:
            record = RunRecord(run_id=run_id, started_at=T0)
            await store.register_run(record)
        except ValueError:
            outcomes['rejected'] += 1
            assert [run.run_id for run in await store.list_runs()] == ['sentinel'], 'nothing was written'
        else:
            outcomes['stored'] += 1
            assert await store.get_run(run_id=run_id) == record
            await store.append_event(StepEvent(run_id=run_id, kind='run_started', step_index=0))
            await store.save_snapshot(ContinuableSnapshot(run_id=run_id, step_index=1, messages=sample_history(1)))
            assert [event.kind for event in await store.list_events(run_id=run_id)] == ['run_started']
            assert [s.seq for s in await store.list_snapshots(run_id=run_id)] == [1]
            assert sorted(run.run_id for run in await store.list_runs()) == sorted(['sentinel', run_id])
            await store.delete_run(run_id=run_id)
            assert await store.get_run(run_id=run_id) is None
        await unchanged()

    await for_examples(run_ids, check, always=NASTY_RUN_IDS)
    assert outcomes['stored'] > 0, outcomes
    if isinstance(store, FileStepStore):  # the file store's rule: [A-Za-z0-9_.-]{1,200}, no `..`
        assert outcomes['rejected'] > 0, outcomes


# --- metadata keys and values ---

NASTY_KEYS = ['', '$set', '$', 'a.b', '.', '_id', '\x00', 'k\x00', '%2E', 'ü', 'x' * 300]
NASTY_METADATA = [{key: 'v'} for key in NASTY_KEYS] + [
    {'k': '\x00'},
    {'k': 'v' * 100_000},
    dict.fromkeys('abcdefgh', ''),
]
metadata = st.dictionaries(
    st.one_of(st.sampled_from(NASTY_KEYS), st.text(max_size=12)),
    st.one_of(st.text(max_size=20), st.sampled_from(['\x00', '$set', 'v' * 1000])),
    max_size=4,
)


async def test_metadata_gets_a_clear_error_or_an_exact_round_trip(session: BackendSession) -> None:
    store = await session.make()
    unchanged = await write_sentinel(store)
    counter = iter(range(10_000))

    async def check(values: dict[str, str]) -> None:
        run_id = f'meta-{next(counter)}'
        try:
            record = RunRecord(run_id=run_id, metadata=values, started_at=T0)
            await store.register_run(record)
        except ValueError:
            assert await store.get_run(run_id=run_id) is None, 'nothing was written'
        else:
            assert await store.get_run(run_id=run_id) == record
            event = StepEvent(run_id=run_id, kind='run_started', step_index=0, timestamp=T0, metadata=values)
            try:
                await store.append_event(event)
            except ValueError:
                assert await store.list_events(run_id=run_id) == []
            else:
                assert await store.list_events(run_id=run_id) == [event]
            await store.delete_run(run_id=run_id)
        await unchanged()

    await for_examples(metadata, check, always=NASTY_METADATA)


# --- payloads that look like this library's media markers ---

json_leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**53), max_value=2**53),
    st.text(max_size=20),
    st.just('media+sha256://' + '0' * 64),
    st.just('media+sha256://not-a-digest'),
)


def marker_like(children: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    """User data shaped like a media marker or escape, of this or another version."""
    body = st.fixed_dictionaries(
        {'v': st.sampled_from([MARKER_VERSION, MARKER_VERSION + 1, '1'])},
        optional={
            'uri': st.just('media+sha256://' + 'a' * 64),
            'encoding': st.sampled_from(['base64', 'utf-8', 'rot13']),
            'size': st.integers(0, 10),
            'escaped': children,
        },
    )
    return st.one_of(
        st.builds(lambda value: {MARKER_KEY: value}, body),
        st.builds(
            lambda value, extra: {MARKER_KEY: value, **extra},
            body,
            st.dictionaries(st.text(max_size=5), children, max_size=2),
        ),
    )


json_trees = st.recursive(
    json_leaves,
    lambda children: st.one_of(
        st.lists(children, max_size=3),
        st.dictionaries(st.text(max_size=8), children, max_size=3),
        marker_like(children),
    ),
    max_leaves=12,
)


def history_with(content: Any, call_id: str) -> list[ModelMessage]:
    return [
        ModelResponse(parts=[ToolCallPart('lookup', {'q': content}, call_id)], timestamp=T0),
        ModelRequest(parts=[ToolReturnPart('lookup', content, call_id, timestamp=T0)]),
    ]


async def test_marker_looking_payloads_round_trip_unchanged(session: BackendSession) -> None:
    # A low threshold so that the strings inside marker-like data are moved to the media store too.
    options = {} if session.count_media_blobs is None else {'media_threshold_bytes': 16}
    store = await session.make(**options)
    unchanged = await write_sentinel(store)
    await store.register_run(RunRecord(run_id='markers'))
    counter = iter(range(10_000))

    async def check(content: Any) -> None:
        messages = history_with(content, f'call-{next(counter)}')
        await store.save_snapshot(ContinuableSnapshot(run_id='markers', step_index=1, messages=messages))
        latest = await store.latest_snapshot(run_id='markers')
        assert latest is not None and fingerprint(latest.messages) == fingerprint(messages)
        await unchanged()

    await for_examples(json_trees, check)


# --- huge messages: just under and over the media threshold ---


@pytest.mark.parametrize('excess', [-1, 0, 1])
async def test_strings_just_under_and_over_the_media_threshold(session: BackendSession, excess: int) -> None:
    store = await session.make()
    unchanged = await write_sentinel(store)
    blobs_before = None if session.count_media_blobs is None else await session.count_media_blobs()
    # Two-byte characters: the threshold counts UTF-8 bytes, not characters.
    size = DEFAULT_THRESHOLD_BYTES + excess
    content = 'é' * (size // 2) + 'x' * (size % 2)
    assert len(content.encode()) == size
    await store.register_run(RunRecord(run_id='huge'))
    messages = history_with(content, 'big')
    await store.save_snapshot(ContinuableSnapshot(run_id='huge', step_index=1, messages=messages))
    latest = await store.latest_snapshot(run_id='huge')
    assert latest is not None and fingerprint(latest.messages) == fingerprint(messages)
    if session.count_media_blobs is not None:
        added = await session.count_media_blobs() - (blobs_before or 0)
        assert added == (1 if excess >= 0 else 0), 'a string of at least the threshold goes to the media store'
    await unchanged()


async def test_a_document_over_the_mongo_limit_is_refused_clearly(request: pytest.FixtureRequest) -> None:
    async with BACKENDS['mongo'].open(request) as opened:
        store = await opened.make(media_store=None)
        unchanged = await write_sentinel(store)
        await store.register_run(RunRecord(run_id='huge'))
        limit = 16 * 1024 * 1024
        under = history_with('u' * (limit - 64 * 1024), 'under')
        await store.save_snapshot(ContinuableSnapshot(run_id='huge', step_index=1, messages=under))
        with pytest.raises(ValueError, match='16 MiB'):
            await store.save_snapshot(
                ContinuableSnapshot(run_id='huge', step_index=2, messages=history_with('o' * limit, 'over'))
            )
        [kept] = await store.list_snapshots(run_id='huge', include_interrupted=True)
        assert kept.step_index == 1 and fingerprint(kept.messages) == fingerprint(under)
        await unchanged()
