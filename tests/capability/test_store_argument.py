"""`StepPersistence(store=...)` refuses what is not a store when it is built, not at the first write."""

from __future__ import annotations

import pytest

from step_persistence import InMemoryStepStore, StepPersistence


def test_a_url_string_is_refused_with_a_hint_and_without_its_password() -> None:
    with pytest.raises(TypeError, match='from_spec') as refused:
        StepPersistence(store='postgresql://app:Secret9@db/app')  # type: ignore[arg-type]
    assert 'Secret9' not in str(refused.value)


@pytest.mark.parametrize('value', [None, 5, object(), {'backend': 'memory'}])
def test_an_object_that_is_not_a_store_is_refused(value: object) -> None:
    with pytest.raises(TypeError, match='must be a StepStore'):
        StepPersistence(store=value)  # type: ignore[arg-type]


def test_a_store_and_the_spec_forms_are_accepted() -> None:
    store = InMemoryStepStore()
    assert StepPersistence(store=store).store is store
    assert isinstance(StepPersistence.from_spec(store='memory').store, InMemoryStepStore)
    assert isinstance(StepPersistence().store, InMemoryStepStore)
