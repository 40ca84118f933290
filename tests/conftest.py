from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from backends import BACKENDS, Backend, StoreMaker


@pytest.fixture
def anyio_backend() -> str:
    return 'asyncio'


@pytest.fixture(params=sorted(BACKENDS))
def backend(request: pytest.FixtureRequest) -> Backend:
    return BACKENDS[request.param]


@pytest.fixture
async def make_store(backend: Backend, request: pytest.FixtureRequest) -> AsyncIterator[StoreMaker]:
    async with backend.open(request) as make:
        yield make
