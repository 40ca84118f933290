"""What a crashed child committed, as the test knows it from the child's progress messages.

`RunLedger` replays the items of every store write the child confirmed (`done`), and keeps the
writes that had begun but were not confirmed when the child was killed. `candidates()` lists
every store state the kill may have left: each unconfirmed write applied not at all, or (on a
store without transactions) as any prefix of its items, or wholly; a transactional store killed
inside a write must show none of it. The store must show exactly one of these states.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field, replace
from typing import Any

from pydantic_ai.messages import ModelMessage

from step_persistence import StepStore
from support.crash_zygote import digest

Effect = tuple[str, str, str | None, str | None]
"""(status, tool_name, idempotency_key, effect_summary)."""


@dataclass(frozen=True)
class StoreState:
    """One run as the store shows it, reduced to what the test can predict exactly."""

    registered: bool = False
    events: tuple[tuple[str, str, str | None], ...] = ()
    """(idempotency_key, kind, tool_call_id) of the run's events, in append order."""
    effects: tuple[tuple[str, Effect], ...] = ()
    """Ledger records by tool call id, sorted by id."""
    snapshots: tuple[tuple[str, str, str], ...] = ()
    """(idempotency_key, state, digest) of the retained snapshots, in sequence order."""

    def apply(self, item: list[Any]) -> StoreState:
        kind = item[0]
        if kind == 'run':
            return replace(self, registered=True)
        if kind == 'event':
            if any(key == item[1] for key, _, _ in self.events):
                return self
            return replace(self, events=(*self.events, (item[1], item[2], item[3])))
        if kind == 'snapshot':
            if any(key == item[1] for key, _, _ in self.snapshots):
                return self
            return replace(self, snapshots=(*self.snapshots, (item[1], item[2], item[3])))
        assert kind == 'effect', item
        _, call_id, status, tool_name, key, summary = item
        effects = dict(self.effects)
        stored = effects.get(call_id)
        if stored is not None:  # the upsert keeps stored annotations that the new record leaves null
            key = key if key is not None else stored[2]
            summary = summary if summary is not None else stored[3]
        effects[call_id] = (status, tool_name, key, summary)
        return replace(self, effects=tuple(sorted(effects.items())))

    @property
    def unresolved(self) -> set[str]:
        return {call_id for call_id, effect in self.effects if effect[0] == 'started'}

    @property
    def completed_tools(self) -> list[str]:
        """Every call whose ledger record says `completed`, whether or not its ending event was written."""
        return sorted(effect[1] for _, effect in self.effects if effect[0] == 'completed')

    @property
    def latest_complete(self) -> tuple[str, str, str] | None:
        complete = [snapshot for snapshot in self.snapshots if snapshot[1] == 'complete']
        return complete[-1] if complete else None


@dataclass
class RunLedger:
    run_id: str
    transactional: bool
    committed: StoreState = field(default_factory=StoreState)
    in_flight: dict[int, list[list[Any]]] = field(default_factory=dict[int, list[list[Any]]])
    """Writes begun and not confirmed, by number."""
    inside: set[int] = field(default_factory=set[int])
    """In-flight writes that had started I/O when the child was killed."""
    call_ids: set[str] = field(default_factory=set[str])
    tool_bodies: list[str] = field(default_factory=list[str])
    """Tool calls whose body started, in order."""
    confirmed_settled: set[str] = field(default_factory=set[str])
    """Tool calls whose `completed`/`failed` record was confirmed committed."""
    started_before_body: bool = True
    """Whether every tool body started after its `started` record was confirmed committed."""

    def observe(self, message: dict[str, Any]) -> None:
        op = message['op']
        if op == 'begin':
            self.in_flight[message['n']] = message['items']
            self.call_ids.update(item[1] for item in message['items'] if item[0] == 'effect')
        elif op == 'io':
            self.inside.update(self.in_flight)
        elif op == 'done':
            items = self.in_flight.pop(message['n'])
            self.inside.discard(message['n'])
            for item in items:
                self.committed = self.committed.apply(item)
                if item[0] == 'effect' and item[2] != 'started':
                    self.confirmed_settled.add(item[1])
        elif op == 'tool':
            self.tool_bodies.append(message['call'])
            self.started_before_body &= message['call'] in self.committed.unresolved

    def candidates(self) -> list[StoreState]:
        """Every state the store may show after the kill (see the module docstring)."""
        choices: list[list[list[list[Any]]]] = []
        for number, items in sorted(self.in_flight.items()):
            if number not in self.inside:
                choices.append([[]])  # killed before the write did any I/O
            elif self.transactional:
                choices.append([[], items])
            else:
                choices.append([items[:length] for length in range(len(items) + 1)])
        states: list[StoreState] = []
        for picked in itertools.product(*choices):
            state = self.committed
            for items in picked:
                for item in items:
                    state = state.apply(item)
            if state not in states:
                states.append(state)
        return states

    def surely_unresolved(self) -> set[str]:
        """Calls whose body ran and whose ending was not confirmed, and no unconfirmed write could end."""
        in_flight = [item for items in self.in_flight.values() for item in items]
        could_settle = {item[1] for item in in_flight if item[0] == 'effect' and item[2] != 'started'}
        return set(self.tool_bodies) - self.confirmed_settled - could_settle


def fingerprint(messages: list[ModelMessage]) -> str:
    return digest(messages)


async def observe_store(store: StepStore, run_id: str, call_ids: set[str]) -> StoreState:
    """The run as `store` shows it, through every read the protocol has."""
    record = await store.get_run(run_id=run_id)
    events = await store.list_events(run_id=run_id)
    snapshots = await store.list_snapshots(run_id=run_id, include_interrupted=True)
    effects: dict[str, Effect] = {}
    for call_id in sorted(call_ids):
        effect = await store.get_tool_effect(run_id=run_id, tool_call_id=call_id)
        if effect is not None:
            effects[call_id] = (effect.status, effect.tool_name, effect.idempotency_key, effect.effect_summary)
    assert all(event.idempotency_key is not None for event in events)
    return StoreState(
        registered=record is not None,
        events=tuple((str(event.idempotency_key), event.kind, event.tool_call_id) for event in events),
        effects=tuple(sorted(effects.items())),
        snapshots=tuple(
            (str(snapshot.idempotency_key), snapshot.state, fingerprint(snapshot.messages)) for snapshot in snapshots
        ),
    )
