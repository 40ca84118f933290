"""The registry of step-store backends that the conformance and capability suites run against.

Each backend builds fresh, empty stores inside a test's private resources (temporary directory,
database, namespace) and declares its known divergences from the conformance suite.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest

from step_persistence import InMemoryStepStore, StepStore

StoreMaker = Callable[..., Any]


@dataclass(frozen=True)
class Backend:
    """How to open stores of one backend for one test."""

    name: str
    open: Callable[[pytest.FixtureRequest], AbstractAsyncContextManager[StoreMaker]]
    """Yields `make(**options) -> StepStore`; every store made is closed when the context exits."""
    divergences: Mapping[str, str] = field(default_factory=dict)
    """Conformance test name -> why this backend differs; such tests run as strict xfails."""


def closing_maker(
    build: Callable[..., StepStore],
) -> Callable[[pytest.FixtureRequest], AbstractAsyncContextManager[StoreMaker]]:
    """A backend opener for stores that need nothing but their constructor options."""

    @asynccontextmanager
    async def open_backend(request: pytest.FixtureRequest) -> AsyncIterator[StoreMaker]:
        stores: list[StepStore] = []

        async def make(**options: Any) -> StepStore:
            store = build(**options)
            stores.append(store)
            return store

        try:
            yield make
        finally:
            for store in stores:
                await store.aclose()

    return open_backend


BACKENDS: dict[str, Backend] = {
    'memory': Backend(name='memory', open=closing_maker(InMemoryStepStore)),
}
