"""`StepPersistence(store=...)` refuses what is not a store when it is built; `from_spec` builds one, in our
form (`store=`) and in the seed's (`backend=` with the store's options)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic_ai import Agent

from step_persistence import FileStepStore, InMemoryStepStore, SqliteStepStore, StepPersistence

pytestmark = pytest.mark.anyio


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


def test_from_spec_takes_the_seeds_backend_form(tmp_path: Path) -> None:
    memory = StepPersistence.from_spec(backend='memory', agent_name='librarian', max_snapshots_per_run=3)
    assert isinstance(memory.store, InMemoryStepStore)
    assert (memory.agent_name, memory.store.max_snapshots_per_run) == ('librarian', 3)
    files = StepPersistence.from_spec(backend='file', directory=str(tmp_path / 'runs'), capture_frontier=True)
    assert isinstance(files.store, FileStepStore) and files.capture_frontier
    assert files.store.directory == tmp_path / 'runs'
    with pytest.raises(ValueError, match="unknown backend 'nosuch'"):
        StepPersistence.from_spec(backend='nosuch')
    with pytest.raises(ValueError, match='not both'):
        StepPersistence.from_spec(backend='memory', store='memory')


async def test_an_agent_spec_names_the_capability_in_the_seeds_form(tmp_path: Path) -> None:
    database = tmp_path / 'runs.db'
    spec = {
        'model': 'test',
        'capabilities': [
            {'StepPersistence': {'backend': 'sqlite', 'database': str(database), 'agent_name': 'from-spec'}}
        ],
    }
    agent = Agent.from_spec(spec, custom_capability_types=[StepPersistence])
    await agent.run('hello')
    async with SqliteStepStore(database) as store:
        [record] = await store.list_runs()
    assert record.agent_name == 'from-spec' and record.run_id.startswith('from-spec-')


def test_the_seeds_names_work() -> None:
    from dataclasses import dataclass

    from step_persistence import SnapshotSaved

    @dataclass
    class Deps:
        user: str

    class Mine(StepPersistence[None]):
        pass

    typed = StepPersistence[Deps](agent_name='typed')
    assert isinstance(typed, StepPersistence) and isinstance(Mine(), StepPersistence)
    event = SnapshotSaved(run_id='r-1', conversation_id=None, step_index=2, state='complete')
    assert event.persistence_run_id == 'r-1'


async def test_the_per_run_copy_carries_the_run_id() -> None:
    from pydantic_ai.models.test import TestModel

    from step_persistence.capability import StepPersistence as Capability

    seen: list[str | None] = []

    class Watching(Capability[None]):
        async def before_run(self, ctx) -> None:  # type: ignore[no-untyped-def]
            seen.append(self.run_id)
            await super().before_run(ctx)

    store = InMemoryStepStore()
    agent = Agent(TestModel(), capabilities=[Watching(store=store, agent_name='librarian')])
    await agent.run('one')
    await agent.run('two')
    assert [run.run_id for run in await store.list_runs()] == seen
    assert all(run_id is not None and run_id.startswith('librarian-') for run_id in seen) and seen[0] != seen[1]
