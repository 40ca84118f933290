"""The durable journal's conformance suite, on every backend that holds a journal.

The file store holds none yet (docs/durable.md, "What is not done yet"):
`test_stores_without_a_journal_say_so` checks that it refuses clearly, and whoever writes its
journal adds it to `JOURNAL_BACKENDS` here (the test below fails until then).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from step_persistence.durable.journals import journal_for
from step_persistence.testing.conformance.journal import JournalConformance
from support.backends import BACKENDS, StoreMaker

JOURNAL_BACKENDS = ('memory', 'mongo', 'motor', 'postgres', 'sqlite')


class TestJournal(JournalConformance):
    @pytest.fixture(params=JOURNAL_BACKENDS)
    async def make_store(self, request: pytest.FixtureRequest) -> AsyncIterator[StoreMaker]:
        async with BACKENDS[request.param].open(request) as session:
            yield session.make


@pytest.mark.anyio
@pytest.mark.parametrize('name', sorted(set(BACKENDS) - set(JOURNAL_BACKENDS)))
async def test_stores_without_a_journal_say_so(name: str, request: pytest.FixtureRequest) -> None:
    async with BACKENDS[name].open(request) as session:
        store = await session.make()
        with pytest.raises(TypeError, match=r'holds no durable journal.*continue_run'):
            journal_for(store)
