"""`externalize_media` / `restore_media`: exact round trips, unambiguous markers, no needless uploads."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic_ai.messages import (
    BinaryContent,
    FilePart,
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelRequest,
    ModelResponse,
    SystemPromptPart,
    TextPart,
    ThinkingPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)

from step_persistence.media import DiskMediaStore, externalize_media, media_uri_for, restore_media
from step_persistence.media.walker import MARKER_KEY, MARKER_VERSION
from support.counting_store import CountingMediaStore

pytestmark = pytest.mark.anyio

PNG = b'\x89PNG\r\n\x1a\n' + bytes(range(256))


@pytest.fixture(scope='module')
def shared_store(tmp_path_factory: pytest.TempPathFactory) -> DiskMediaStore:
    """One disk store for every example of the property tests: blobs are immutable, so sharing is safe."""
    return DiskMediaStore(tmp_path_factory.mktemp('walker-media'))


@pytest.fixture
def disk(tmp_path: Path) -> DiskMediaStore:
    return DiskMediaStore(tmp_path / 'media')


def exact(tree: Any) -> str:
    """A serialization that tells apart everything JSON can: key order, `1` vs `1.0` vs `True`."""
    return json.dumps(tree, ensure_ascii=True, allow_nan=False)


def dump(messages: list[ModelMessage]) -> Any:
    return ModelMessagesTypeAdapter.dump_python(messages, mode='json')


# -- strategies ------------------------------------------------------------------------------

base64_texts = st.binary(max_size=48).flatmap(
    lambda data: st.sampled_from(
        [base64.b64encode(data).decode(), base64.urlsafe_b64encode(data).decode(), base64.b64encode(data).decode()[:-1]]
    )
)
scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=80)
    | base64_texts
    | st.sampled_from(['binary', MARKER_KEY, media_uri_for(b'x'), 'utf-8', 'base64url'])
)
keys = st.text(max_size=8) | st.sampled_from(
    [MARKER_KEY, 'kind', 'data', 'media_type', 'v', 'uri', 'escaped', 'encoding', 'size']
)


def _marker_like(children: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    """User data shaped exactly like this library's markers and escapes (any version)."""
    blob = st.fixed_dictionaries(
        {
            'v': st.integers(0, 3),
            'uri': st.just(media_uri_for(b'x')) | st.text(max_size=8),
            'encoding': st.sampled_from(['utf-8', 'base64', 'base64url', 'rot13']),
            'media_type': st.none() | st.text(max_size=8),
            'size': st.integers(0, 3),
        }
    )
    escape = st.fixed_dictionaries({'v': st.integers(0, 3), 'escaped': st.dictionaries(keys, children, max_size=3)})
    return st.fixed_dictionaries({MARKER_KEY: blob | escape | children}, optional={'other': children})


def _binary_like(children: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries(
        {'kind': st.just('binary'), 'data': base64_texts | st.text(max_size=12)},
        optional={'media_type': st.none() | st.text(max_size=8), 'identifier': children},
    )


json_trees = st.recursive(
    scalars,
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(keys, children, max_size=4)
        | _marker_like(children)
        | _binary_like(children)
    ),
    max_leaves=25,
)
thresholds = st.integers(min_value=1, max_value=96)

binaries = st.builds(
    lambda data, media_type: BinaryContent(data=data, media_type=media_type),
    st.binary(max_size=200),
    st.sampled_from(['image/png', 'application/pdf', 'audio/wav']),
)
texts = st.text(max_size=150)
tool_content = (
    json_trees | binaries | st.lists(binaries | texts, max_size=3) | st.dictionaries(keys, binaries, max_size=2)
)
request_parts = st.one_of(
    st.builds(lambda content: UserPromptPart(content=content), texts | st.lists(texts | binaries, max_size=3)),
    st.builds(lambda content: SystemPromptPart(content=content), texts),
    st.builds(lambda content: ToolReturnPart('tool', content, 'call-1'), tool_content),
)
response_parts = st.one_of(
    st.builds(lambda content: TextPart(content=content), texts),
    st.builds(lambda content: ThinkingPart(content=content), texts),
    st.builds(lambda args: ToolCallPart('tool', args, 'call-1'), st.dictionaries(st.text(max_size=5), scalars)),
    st.builds(lambda content: FilePart(content=content), binaries),
)
histories = st.lists(
    st.builds(lambda parts: ModelRequest(parts=parts), st.lists(request_parts, min_size=1, max_size=3))
    | st.builds(lambda parts: ModelResponse(parts=parts), st.lists(response_parts, min_size=1, max_size=3)),
    min_size=1,
    max_size=4,
)

PROPERTY_SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# -- properties ------------------------------------------------------------------------------


@PROPERTY_SETTINGS
@given(tree=json_trees, threshold=thresholds)
async def test_any_json_tree_round_trips_exactly(shared_store: DiskMediaStore, tree: Any, threshold: int) -> None:
    before = exact(tree)
    stored = await externalize_media(tree, media_store=shared_store, threshold_bytes=threshold)
    assert exact(tree) == before, 'externalize_media modified its input'
    json.dumps(stored, allow_nan=False)
    assert exact(await restore_media(stored, media_store=shared_store)) == before


@PROPERTY_SETTINGS
@given(messages=histories, threshold=thresholds)
async def test_message_histories_round_trip_and_every_binary_is_stored(
    shared_store: DiskMediaStore, messages: list[ModelMessage], threshold: int
) -> None:
    tree = dump(messages)
    stored = await externalize_media(tree, media_store=shared_store, threshold_bytes=threshold)
    restored = await restore_media(stored, media_store=shared_store)
    assert exact(restored) == exact(tree)
    assert exact(dump(ModelMessagesTypeAdapter.validate_python(restored))) == exact(
        dump(ModelMessagesTypeAdapter.validate_python(tree))
    )
    for data in _binary_payloads(messages):
        assert media_uri_for(data) in exact(stored)


def _binary_payloads(messages: list[ModelMessage]) -> list[bytes]:
    """The data of every `BinaryContent` in the messages' part contents (one level of list or dict)."""
    payloads = []
    for message in messages:
        for part in message.parts:
            content = getattr(part, 'content', None)
            if isinstance(content, dict):
                content = list(content.values())
            items = content if isinstance(content, list) else [content]
            payloads.extend(item.data for item in items if isinstance(item, BinaryContent))
    return payloads


# -- the format --------------------------------------------------------------------------------


async def test_marker_format_version_1(disk: DiskMediaStore) -> None:
    """The stored form is a persistence contract (docs/media.md): changing it needs a new version."""
    text = 'x' * 10
    tree = {
        'content': [
            {'data': base64.urlsafe_b64encode(PNG).decode(), 'media_type': 'image/png', 'kind': 'binary'},
            text,
            {MARKER_KEY: 'user data', 'n': 1},
        ]
    }
    stored = await externalize_media(tree, media_store=disk, threshold_bytes=10)
    assert stored == {
        'content': [
            {
                'data': {
                    MARKER_KEY: {
                        'v': 1,
                        'uri': media_uri_for(PNG),
                        'encoding': 'base64url',
                        'media_type': 'image/png',
                        'size': len(PNG),
                    }
                },
                'media_type': 'image/png',
                'kind': 'binary',
            },
            {
                MARKER_KEY: {
                    'v': 1,
                    'uri': media_uri_for(text.encode()),
                    'encoding': 'utf-8',
                    'media_type': 'text/plain; charset=utf-8',
                    'size': 10,
                }
            },
            {MARKER_KEY: {'v': 1, 'escaped': {MARKER_KEY: 'user data', 'n': 1}}},
        ]
    }
    assert MARKER_VERSION == 1
    assert await restore_media(stored, media_store=disk) == tree


async def test_standard_base64_keeps_its_alphabet(disk: DiskMediaStore) -> None:
    data = b'\xfb\xff\xbf' * 4
    tree = {'kind': 'binary', 'data': base64.b64encode(data).decode(), 'media_type': 'application/octet-stream'}
    stored = await externalize_media(tree, media_store=disk)
    assert stored['data'][MARKER_KEY]['encoding'] == 'base64'
    assert await restore_media(stored, media_store=disk) == tree
    assert await disk.get(media_uri_for(data)) == data


@pytest.mark.parametrize('data', ['AQI', 'AQI=\n', ' AQI=', 'not base64!', 'é'])
async def test_binary_data_that_is_not_canonical_base64_is_kept_as_text(disk: DiskMediaStore, data: str) -> None:
    tree = {'kind': 'binary', 'data': data, 'media_type': 'image/png'}
    counting = CountingMediaStore(disk)
    assert await externalize_media(tree, media_store=counting) == tree
    assert counting.calls['put'] == 0


async def test_threshold_counts_utf8_bytes_and_is_inclusive(disk: DiskMediaStore) -> None:
    at = 'é' * 8  # 16 UTF-8 bytes
    below = 'é' * 7 + 'e'  # 15 UTF-8 bytes
    stored = await externalize_media([at, below], media_store=disk, threshold_bytes=16)
    assert stored[0][MARKER_KEY]['size'] == 16
    assert stored[1] == below
    assert await restore_media(stored, media_store=disk) == [at, below]


@pytest.mark.parametrize('threshold', [0, -1, 1.5, True, '64'])
async def test_threshold_must_be_a_positive_int(disk: DiskMediaStore, threshold: Any) -> None:
    with pytest.raises(ValueError, match='threshold_bytes'):
        await externalize_media({}, media_store=disk, threshold_bytes=threshold)


async def test_a_string_that_is_not_valid_unicode_stays_inline(disk: DiskMediaStore) -> None:
    tree = ['\ud800' + 'x' * 100]
    stored = await externalize_media(tree, media_store=disk, threshold_bytes=10)
    assert stored == tree
    assert await restore_media(stored, media_store=disk) == tree


@pytest.mark.parametrize('version', [0, 2, 99])
async def test_unknown_marker_version_is_a_value_error(disk: DiskMediaStore, version: int) -> None:
    counting = CountingMediaStore(disk)
    tree = {'data': {MARKER_KEY: {'v': version, 'uri': media_uri_for(b'x'), 'encoding': 'utf-8', 'size': 1}}}
    with pytest.raises(ValueError, match=f'version {version} is not supported'):
        await restore_media(tree, media_store=counting)
    assert counting.calls['get'] == 0


@pytest.mark.parametrize(
    'marker',
    [
        {MARKER_KEY: 'not an object'},
        {MARKER_KEY: {'uri': media_uri_for(b'x')}},
        {MARKER_KEY: {'v': True, 'escaped': {}}},
        {MARKER_KEY: {'v': 1, 'escaped': {}}, 'extra': 1},
        {MARKER_KEY: {'v': 1, 'escaped': []}},
        {MARKER_KEY: {'v': 1, 'uri': 'media+sha256://short', 'encoding': 'utf-8', 'media_type': None, 'size': 1}},
        {MARKER_KEY: {'v': 1, 'uri': media_uri_for(b'x'), 'encoding': 'rot13', 'media_type': None, 'size': 1}},
        {MARKER_KEY: {'v': 1, 'uri': media_uri_for(b'x'), 'encoding': 'utf-8', 'media_type': None, 'size': '1'}},
        {MARKER_KEY: {'v': 1, 'uri': media_uri_for(b'x'), 'encoding': 'utf-8', 'media_type': None}},
    ],
)
async def test_malformed_markers_are_value_errors(disk: DiskMediaStore, marker: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=r'media marker|not a media URI'):
        await restore_media([marker], media_store=disk)


# -- behaviour ---------------------------------------------------------------------------------


async def test_a_tree_without_payloads_is_returned_as_is_without_store_calls(disk: DiskMediaStore) -> None:
    counting = CountingMediaStore(disk)
    tree = dump([ModelRequest(parts=[UserPromptPart(content='hello'), ToolReturnPart('t', {'a': [1, 2]}, 'c')])])
    assert await externalize_media(tree, media_store=counting) is tree
    assert await restore_media(tree, media_store=counting) is tree
    assert sum(counting.calls.values()) == 0


async def test_blobs_known_to_be_stored_are_not_sent_again(disk: DiskMediaStore) -> None:
    tree = dump([ModelRequest(parts=[UserPromptPart(content=[BinaryContent(data=PNG, media_type='image/png')])])])
    first = CountingMediaStore(disk)
    await externalize_media(tree, media_store=first)
    assert (first.calls['exists'], first.calls['put']) == (1, 1)
    await externalize_media(tree, media_store=first)
    assert (first.calls['exists'], first.calls['put']) == (1, 1), 'this process already stored it'
    other_process = CountingMediaStore(DiskMediaStore(disk.directory))
    await externalize_media(tree, media_store=other_process)
    assert (other_process.calls['exists'], other_process.calls['put']) == (1, 0), '`exists` says it is stored'


async def test_a_payload_repeated_in_one_tree_is_put_once(disk: DiskMediaStore) -> None:
    counting = CountingMediaStore(disk)
    image = BinaryContent(data=PNG, media_type='image/png')
    tree = dump([ModelRequest(parts=[UserPromptPart(content=[image, image]), ToolReturnPart('t', image, 'c')])])
    await externalize_media(tree, media_store=counting)
    assert counting.put_data == [PNG]


async def test_puts_of_one_tree_run_concurrently(disk: DiskMediaStore) -> None:
    gated = CountingMediaStore(disk, gate_after=3)
    images = [BinaryContent(data=bytes([n]) * 10, media_type='image/png') for n in range(3)]
    tree = dump([ModelRequest(parts=[UserPromptPart(content=images)])])
    stored = await externalize_media(tree, media_store=gated)
    assert gated.calls['put'] == 3
    assert await restore_media(stored, media_store=disk) == tree


async def test_store_errors_surface_as_themselves(disk: DiskMediaStore, tmp_path: Path) -> None:
    images = [BinaryContent(data=bytes([n]) * 10, media_type='image/png') for n in range(3)]
    tree = dump([ModelRequest(parts=[UserPromptPart(content=images)])])
    escaping = DiskMediaStore(tmp_path / 'other', key_strategy=lambda uri, context: f'../{uri[15:]}')
    with pytest.raises(ValueError, match='key strategy'):
        await externalize_media(tree, media_store=escaping)

    stored = await externalize_media(tree, media_store=disk)
    with pytest.raises(FileNotFoundError):
        await restore_media(stored, media_store=DiskMediaStore(tmp_path / 'empty'))
    disk.path_for(media_uri_for(bytes([1]) * 10)).write_bytes(b'tampered')
    with pytest.raises(ValueError, match='corrupt'):
        await restore_media(stored, media_store=disk)


async def test_large_real_history_shrinks_and_restores_byte_identical(disk: DiskMediaStore) -> None:
    image = bytes(range(256)) * (5 * 1024 * 1024 // 256)
    text = 'Lorem ipsum ✓ ' * (1024 * 1024 // 16)
    messages: list[ModelMessage] = [
        ModelRequest(parts=[UserPromptPart(content='make a picture')]),
        ModelResponse(parts=[ToolCallPart('draw', {'size': 5}, 'call-1')]),
        ModelRequest(parts=[ToolReturnPart('draw', BinaryContent(data=image, media_type='image/png'), 'call-1')]),
        ModelResponse(parts=[TextPart(content=text)]),
    ]
    tree = dump(messages)
    stored = await externalize_media(tree, media_store=disk)
    assert len(exact(stored)) < 4096
    restored = ModelMessagesTypeAdapter.validate_python(await restore_media(stored, media_store=disk))
    assert restored[2].parts[0].content.data == image  # type: ignore[union-attr]
    assert restored[3].parts[0].content == text  # type: ignore[union-attr]
