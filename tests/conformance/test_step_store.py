"""The conformance suite, run once per registered backend."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from step_persistence.testing import StepStoreConformance
from support.backends import Backend


class TestStepStore(StepStoreConformance):
    @pytest.fixture
    def backend(self, any_backend: Backend) -> Backend:
        """The whole suite on every backend, client variants included (MongoDB through pymongo and motor)."""
        return any_backend

    @pytest.fixture(autouse=True)
    def _declared_divergence(self, request: pytest.FixtureRequest, backend: Backend) -> None:
        divergences: Mapping[str, str] = backend.divergences
        reason = divergences.get(request.node.originalname)
        if reason is not None:
            request.node.add_marker(pytest.mark.xfail(strict=True, reason=reason))


def test_every_backend_lists_snapshot_states_without_messages() -> None:
    """`runs list` and `report` read snapshot states through `list_snapshot_states` on every backend, so
    summarising a run decodes no message (and imports no pydantic-ai)."""
    from step_persistence import InMemoryStepStore
    from step_persistence.stores.file import FileStepStore
    from step_persistence.stores.mongo import MongoStepStore
    from step_persistence.stores.sql import SqlStepStore

    for store_class in (InMemoryStepStore, FileStepStore, MongoStepStore, SqlStepStore):
        assert callable(getattr(store_class, 'list_snapshot_states', None)), store_class
