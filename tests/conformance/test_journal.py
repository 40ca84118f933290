"""The durable journal's conformance suite, on every backend (each holds a journal)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from step_persistence import InMemoryStepStore
from step_persistence.durable.journals import journal_for
from step_persistence.testing.conformance.journal import JournalConformance
from support.backends import BACKENDS, StoreMaker
from support.recording import RecordingStore


class TestJournal(JournalConformance):
    @pytest.fixture(params=sorted(BACKENDS))
    async def make_store(self, request: pytest.FixtureRequest) -> AsyncIterator[StoreMaker]:
        async with BACKENDS[request.param].open(request) as session:
            yield session.make


def test_a_store_without_a_journal_says_so() -> None:
    """A third-party store that implements no `JournalStore` (a wrapper, here) is refused clearly."""
    with pytest.raises(TypeError, match=r'RecordingStore holds no durable journal.*continue_run'):
        journal_for(RecordingStore(InMemoryStepStore()))
