"""Media URIs, `MediaContext`, key checks and static public URLs."""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Any

import pytest

from step_persistence.media import MediaContext, default_key_strategy, make_static_public_url, media_uri_for
from step_persistence.media import parse_media_uri as parse


def test_media_uri_is_the_sha256_in_lowercase_hex() -> None:
    digest = hashlib.sha256(b'abc').hexdigest()
    assert media_uri_for(b'abc') == f'media+sha256://{digest}'
    assert media_uri_for(bytearray(b'abc')) == media_uri_for(memoryview(b'abc')) == media_uri_for(b'abc')
    assert parse(media_uri_for(b'abc')) == digest


def test_media_uri_needs_bytes() -> None:
    with pytest.raises(TypeError):
        media_uri_for('abc')  # type: ignore[arg-type]


@pytest.mark.parametrize(
    'uri',
    [
        '',
        'media+sha256://',
        'media+sha256://' + 'g' * 64,
        'MEDIA+SHA256://' + 'a' * 64,
        'media+sha256://' + 'a' * 65,
        ' media+sha256://' + 'a' * 64,
        'media+sha256://' + 'a' * 64 + '\n',
        None,
        b'media+sha256://' + b'a' * 64,
    ],
)
def test_anything_else_is_not_a_media_uri(uri: Any) -> None:
    with pytest.raises(ValueError, match='not a media URI'):
        parse(uri)


def test_media_context_is_frozen_keyword_only_and_copies_its_metadata() -> None:
    metadata = {'k': 'v'}
    context = MediaContext(media_type='image/png', metadata=metadata)
    metadata['k'] = 'changed'
    assert dict(context.metadata) == {'k': 'v'}
    with pytest.raises(dataclasses.FrozenInstanceError):
        context.media_type = 'text/plain'  # type: ignore[misc]
    with pytest.raises(TypeError):
        context.metadata['k'] = 'x'  # type: ignore[index]
    with pytest.raises(TypeError):
        MediaContext('image/png')  # type: ignore[misc]
    assert MediaContext() == MediaContext(media_type=None, filename=None, metadata={})


@pytest.mark.parametrize(
    'options', [{'metadata': {'k': 1}}, {'metadata': {1: 'v'}}, {'media_type': b'image/png'}, {'filename': 3}]
)
def test_media_context_checks_its_types(options: dict[str, Any]) -> None:
    with pytest.raises(TypeError):
        MediaContext(**options)


def test_default_key_strategy() -> None:
    uri = 'media+sha256://' + 'ab' * 32
    assert default_key_strategy(uri, MediaContext(media_type='image/png')) == 'ab' * 32 + '.bin'


def test_static_public_url_encodes_the_key_and_respects_the_strategy() -> None:
    uri = media_uri_for(b'x')
    digest = parse(uri)
    resolve = make_static_public_url(
        'https://cdn.example/', 'my media/', key_strategy=lambda uri, c: f'{c.filename}/{parse(uri)}'
    )
    assert resolve(uri, MediaContext(filename='a#b')) == f'https://cdn.example/my%20media/a%23b/{digest}'
    with pytest.raises(ValueError, match='key strategy'):
        resolve(uri, MediaContext(filename='..'))
