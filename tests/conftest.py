from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

import support.bytecode  # noqa: F401  (first: every import after it is compiled once, into its cache)
from support.backends import BACKENDS, Backend, BackendSession, StoreMaker
from support.databases import empty_database, postgres_database
from support.servers.mongo import mongo_server
from support.servers.postgres import postgres_server

__all__ = ['empty_database', 'mongo_server', 'postgres_database', 'postgres_server']


@pytest.fixture
def anyio_backend() -> str:
    return 'asyncio'


CLIENT_VARIANTS = frozenset({'motor'})
"""Backends that are another client library for a backend of the registry (motor for MongoDB): they run the store
suites (the conformance suite, the media suite) and the tests that depend on the client, not the capability and
command-line matrix, which reaches the store only through the protocol the conformance suite checks."""


@pytest.fixture(params=sorted(name for name in BACKENDS if name not in CLIENT_VARIANTS))
def backend(request: pytest.FixtureRequest) -> Backend:
    """Every backend of the registry, client variants aside (see `CLIENT_VARIANTS`)."""
    return BACKENDS[request.param]


@pytest.fixture(params=sorted(BACKENDS))
def any_backend(request: pytest.FixtureRequest) -> Backend:
    """Every backend of the registry, client variants included: for the store suites and client-dependent tests."""
    return BACKENDS[request.param]


@pytest.fixture
async def backend_session(backend: Backend, request: pytest.FixtureRequest) -> AsyncIterator[BackendSession]:
    async with backend.open(request) as session:
        yield session


@pytest.fixture
def make_store(backend_session: BackendSession) -> StoreMaker:
    return backend_session.make


@pytest.fixture(params=sorted(name for name in BACKENDS if name != 'memory' and name not in CLIENT_VARIANTS))
def durable_backend(request: pytest.FixtureRequest) -> Backend:
    return BACKENDS[request.param]


@pytest.fixture
async def durable_session(durable_backend: Backend, request: pytest.FixtureRequest) -> AsyncIterator[BackendSession]:
    async with durable_backend.open(request) as session:
        assert session.spec is not None, f'{durable_backend.name} must say how another process opens its data'
        yield session
