"""The `StepStore` conformance suite, importable so any store can be checked against it.

Subclass `StepStoreConformance` in a pytest module and provide a `make_store` fixture::

    import pytest
    from step_persistence.testing import StepStoreConformance


    class TestMyStore(StepStoreConformance):
        @pytest.fixture
        async def make_store(self):
            stores = []

            async def make(**options):
                store = MyStore(**options)
                stores.append(store)
                return store

            yield make
            for store in stores:
                await store.aclose()

Every store `make_store` returns must start empty. Known divergences are declared on the
subclass as `divergences = {'test_name': 'reason'}` and run as strict expected failures.
Requires `pytest` and `anyio` (the suite's async tests use anyio's pytest plugin).
"""

from step_persistence.testing.conformance import StepStoreConformance, StoreFactory, sample_history

__all__ = ['StepStoreConformance', 'StoreFactory', 'sample_history']
