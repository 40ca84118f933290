"""SIGKILL an agent run at seeded random points on every durable backend; nothing committed is lost.

A zygote process imports everything once and forks one child per run (see `crash_zygote.py` for
the progress protocol). The child reports each step over a pipe and stops at the chosen message
until the test says `go`; the test kills it there instead, so a kill lands exactly at a known
message: before a write, between two SQL statements, MongoDB commands or file writes of a write,
in the middle of a file write, after a write returned, or while a tool body runs.
`crash_ledger.RunLedger` turns the messages into the set of store states the kill may have left;
a fresh store must show exactly one of them.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import anyio.to_thread
import pytest
from pydantic_ai import Agent

from step_persistence import StepEvent, StepStore, continue_run, from_spec, inspect_recovery, is_provider_valid
from support.backends import BACKENDS, spec_of
from support.crash_driver import ChildRun, Zygote
from support.crash_ledger import RunLedger, StoreState, fingerprint, observe_store
from support.scripted import scripted, text

pytestmark = pytest.mark.anyio

KILLS_PER_BACKEND = 30
CRASH_BACKENDS = ['file', 'sqlite', 'postgres', 'mongo']
TRANSACTIONAL = {'sqlite', 'postgres'}


@dataclass
class Tally:
    kills: int = 0
    with_unresolved: int = 0
    without_unresolved: int = 0
    inside_writes: int = 0
    between_writes: int = 0


async def drive(
    zygote: Zygote, spec: dict[str, Any], run_id: str, *, backend: str, kill_at: int | None, frontier: bool
) -> tuple[RunLedger, ChildRun]:
    ledger = RunLedger(run_id=run_id, transactional=backend in TRANSACTIONAL)
    command = {'spec': spec, 'run_id': run_id, 'capture_frontier': frontier}
    child = await anyio.to_thread.run_sync(lambda: zygote.run(command, kill_at=kill_at, on_message=ledger.observe))
    return ledger, child


async def check_recovery(store: StepStore, ledger: RunLedger, child: ChildRun) -> StoreState:
    """The store shows one state the kill may have left, and recovery reads agree with it."""
    run_id = ledger.run_id
    candidates = ledger.candidates()
    observed = await observe_store(store, run_id, ledger.call_ids)
    assert observed in candidates, f'killed at {child.killed_at}:\nstore: {observed}\nallowed: {candidates}'
    assert (run_id in {run.run_id for run in await store.list_runs()}) == observed.registered

    if not observed.registered:  # killed before the registration committed: there is nothing to recover
        with pytest.raises(LookupError):
            await inspect_recovery(store, run_id=run_id)
        with pytest.raises(LookupError):
            await continue_run(store, run_id=run_id)
        return observed
    report = await inspect_recovery(store, run_id=run_id)
    unresolved = {effect.tool_call_id for effect in report.unresolved_effects}
    assert unresolved == observed.unresolved
    assert {effect.tool_call_id for effect in await store.list_unresolved_tool_effects(run_id=run_id)} == unresolved
    assert ledger.started_before_body, 'a tool body ran before its `started` record was committed'
    assert ledger.surely_unresolved() <= unresolved, 'a call whose body ran and never ended is not unresolved'
    assert not unresolved & ledger.confirmed_settled, 'a call confirmed ended is reported unresolved'
    assert sorted(report.completed_tools) == observed.completed_tools

    newest = observed.snapshots[-1] if observed.snapshots else None
    assert (None if report.latest_snapshot is None else fingerprint(report.latest_snapshot.messages)) == (
        None if newest is None else newest[2]
    )
    complete = observed.latest_complete
    if complete is None:
        assert report.latest_complete_snapshot is None
        with pytest.raises(LookupError):
            await continue_run(store, run_id=run_id)
    else:
        assert report.latest_complete_snapshot is not None
        assert fingerprint(report.latest_complete_snapshot.messages) == complete[2]
        history = await continue_run(store, run_id=run_id)
        assert is_provider_valid(history)
        resumed = await Agent(scripted(text('resumed'))).run('continue', message_history=history)
        assert resumed.output == 'resumed'
        assert resumed.all_messages()[: len(history)] == history
    return observed


@pytest.mark.parametrize('backend_name', CRASH_BACKENDS)
async def test_sigkill_at_seeded_points_keeps_exactly_what_was_committed(
    backend_name: str, zygote: Zygote, request: pytest.FixtureRequest
) -> None:
    rng = random.Random(f'crash-{backend_name}')
    async with BACKENDS[backend_name].open(request) as session:
        spec = spec_of(session)
        expected: dict[str, tuple[set[str], StoreState]] = {}
        lengths: dict[bool, int] = {}
        for frontier in (False, True):  # one whole run per mode: how many messages a run sends
            run_id = f'whole-{int(frontier)}'
            ledger, child = await drive(zygote, spec, run_id, backend=backend_name, kill_at=None, frontier=frontier)
            assert child.status == 0 and child.messages[-1] == {'op': 'finished'}, zygote.log_tail()
            lengths[frontier] = len(child.messages)
            async with from_spec(**spec) as store:
                state = await check_recovery(store, ledger, child)
            assert state == ledger.committed and not state.unresolved
            expected[run_id] = (ledger.call_ids, state)

        tally = Tally()
        attempt = 0
        while tally.kills < KILLS_PER_BACKEND:
            attempt += 1
            assert attempt <= 2 * KILLS_PER_BACKEND, f'too few kill points were reached: {tally}'
            frontier = rng.random() < 0.5
            kill_at = rng.randint(1, lengths[frontier] - 1)
            run_id = f'crash-{attempt}'
            ledger, child = await drive(zygote, spec, run_id, backend=backend_name, kill_at=kill_at, frontier=frontier)
            if child.killed_at is None:
                assert child.status == 0, zygote.log_tail()
            else:
                assert child.status == -9, zygote.log_tail()
                tally.kills += 1
            async with from_spec(**spec) as store:  # a fresh store object, as after a restart
                state = await check_recovery(store, ledger, child)
                if child.killed_at is not None:
                    tally.with_unresolved += bool(state.unresolved)
                    tally.without_unresolved += not state.unresolved
                    tally.inside_writes += bool(ledger.inside)
                    tally.between_writes += not ledger.inside
                if state.registered:  # the crashed run still takes writes (e.g. after a torn line)
                    await store.append_event(
                        StepEvent(run_id=run_id, kind='run_failed', step_index=0, idempotency_key='after-crash')
                    )
                    state = state.apply(['event', 'after-crash', 'run_failed', None])
            expected[run_id] = (ledger.call_ids, state)

        async with from_spec(**spec) as store:  # nothing was lost or duplicated since, in any run
            runs = await store.list_runs(conversation_id='crash')
            registered = sorted(run_id for run_id, (_, state) in expected.items() if state.registered)
            assert sorted(run.run_id for run in runs) == registered
            for run_id, (call_ids, state) in expected.items():
                assert await observe_store(store, run_id, call_ids) == state, run_id

    print(f'{backend_name}: {tally}')
    assert tally.with_unresolved > 0 and tally.without_unresolved > 0, tally
    assert tally.inside_writes > 0 and tally.between_writes > 0, tally
