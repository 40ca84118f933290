"""The registry of step-store backends that the conformance and capability suites run against.

Each backend opens a private location per test (temporary directory, database, namespace) and
makes fresh stores there; durable backends also say how another process opens the same data.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest

from step_persistence import InMemoryStepStore, StepStore

StoreMaker = Callable[..., Any]
"""`await make(**options)` returns a new store over the test's location."""


@dataclass
class BackendSession:
    """One test's view of a backend: a store factory and, for durable backends, a `from_spec` spec."""

    make: StoreMaker
    spec: Callable[..., dict[str, Any]] | None = None
    """`from_spec(**spec(**options))` opens the same data in another process; `None` if process-local."""


@dataclass(frozen=True)
class Backend:
    """How to open stores of one backend for one test."""

    name: str
    open: Callable[[pytest.FixtureRequest], AbstractAsyncContextManager[BackendSession]]
    divergences: Mapping[str, str] = field(default_factory=dict)
    """Conformance test name -> why this backend differs; such tests run as strict xfails."""


@asynccontextmanager
async def closing(
    build: Callable[..., StepStore], spec: Callable[..., dict[str, Any]] | None = None
) -> AsyncIterator[BackendSession]:
    """A session whose stores are built by `build(**options)` and closed when the test ends."""
    stores: list[StepStore] = []

    async def make(**options: Any) -> StepStore:
        store = build(**options)
        stores.append(store)
        return store

    try:
        yield BackendSession(make=make, spec=spec)
    finally:
        for store in stores:
            await store.aclose()


def _memory(request: pytest.FixtureRequest) -> AbstractAsyncContextManager[BackendSession]:
    return closing(InMemoryStepStore)


BACKENDS: dict[str, Backend] = {
    'memory': Backend(name='memory', open=_memory),
}
