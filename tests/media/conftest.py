from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from support.media_backends import MEDIA_BACKENDS, MediaBackend, MediaSession
from support.servers.s3 import s3_server

__all__ = ['s3_server']


@pytest.fixture(params=sorted(MEDIA_BACKENDS))
def media_backend(request: pytest.FixtureRequest) -> MediaBackend:
    return MEDIA_BACKENDS[request.param]


@pytest.fixture
async def media_session(media_backend: MediaBackend, request: pytest.FixtureRequest) -> AsyncIterator[MediaSession]:
    async with media_backend.open(request) as session:
        yield session
