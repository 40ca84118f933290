"""Several OS processes writing to one store location at once, on every durable backend.

Writers are forked by the zygote (`crash_zygote.run_writers`) and released at the same moment.
"""

from __future__ import annotations

from typing import Any

import anyio.to_thread
import pytest

from step_persistence import RunRecord, from_spec
from step_persistence.testing.conformance import sample_history
from support.backends import BACKENDS, spec_of
from support.crash_driver import Zygote
from support.crash_ledger import fingerprint
from support.crash_zygote import keyed_snapshot

pytestmark = pytest.mark.anyio

DURABLE = ['file', 'sqlite', 'postgres', 'mongo']
WRITERS = 3


async def write_together(zygote: Zygote, jobs: list[dict[str, Any]]) -> None:
    statuses = await anyio.to_thread.run_sync(zygote.write_concurrently, jobs)
    assert statuses == [0] * len(jobs), zygote.log_tail()  # e.g. no `database is locked` reached a writer


@pytest.mark.parametrize('backend_name', DURABLE)
async def test_processes_writing_different_runs_lose_nothing(
    backend_name: str, zygote: Zygote, request: pytest.FixtureRequest
) -> None:
    count = 8
    prefixes = [f'w{writer}' for writer in range(WRITERS)]
    async with BACKENDS[backend_name].open(request) as session:
        spec = spec_of(session)
        await write_together(
            zygote, [{'kind': 'runs', 'args': {'spec': spec, 'prefix': prefix, 'count': count}} for prefix in prefixes]
        )
        async with from_spec(**spec) as store:
            assert len(await store.list_runs()) == WRITERS * count
            for prefix in prefixes:
                written = await store.list_runs(conversation_id=prefix)
                assert sorted(run.run_id for run in written) == sorted(f'{prefix}-{n}' for n in range(count))
                for run in written:
                    events = await store.list_events(run_id=run.run_id)
                    assert [event.kind for event in events] == ['run_started', 'model_request_started', 'run_completed']
                    snapshots = await store.list_snapshots(run_id=run.run_id)
                    assert [(s.seq, s.step_index) for s in snapshots] == [(1, 1), (2, 2)]
                    assert fingerprint(snapshots[1].messages) == fingerprint(sample_history(2, tag=run.run_id))
                    effect = await store.get_tool_effect(run_id=run.run_id, tool_call_id='t')
                    assert effect is not None and effect.status == 'completed'


@pytest.mark.parametrize('backend_name', DURABLE)
@pytest.mark.parametrize('retention', [None, 4])
async def test_processes_saving_snapshots_of_one_run_never_collide(
    backend_name: str, retention: int | None, zygote: Zygote, request: pytest.FixtureRequest
) -> None:
    count = 12
    total = WRITERS * count
    async with BACKENDS[backend_name].open(request) as session:
        spec = spec_of(session, max_snapshots_per_run=retention)
        async with from_spec(**spec) as store:
            await store.register_run(RunRecord(run_id='shared'))
        await write_together(
            zygote,
            [
                {'kind': 'snapshots', 'args': {'spec': spec, 'run_id': 'shared', 'writer': writer, 'count': count}}
                for writer in range(WRITERS)
            ],
        )
        async with from_spec(**spec) as store:
            kept = await store.list_snapshots(run_id='shared', include_interrupted=True)
            seqs = [snapshot.seq for snapshot in kept]
            assert seqs == sorted(set(seqs)), 'sequence numbers are unique and listed in order'
            for snapshot in kept:  # each one is the snapshot its writer saved under its key
                writer, number = map(int, str(snapshot.idempotency_key).split('-'))
                expected = keyed_snapshot('shared', writer, number)
                assert (snapshot.step_index, snapshot.state, fingerprint(snapshot.messages)) == (
                    expected.step_index,
                    expected.state,
                    fingerprint(expected.messages),
                )
            newest_n = list(range(total - (retention or total) + 1, total + 1))
            assert seqs[-len(newest_n) :] == newest_n, 'every save got a sequence number; the newest are all kept'
            if retention is None:
                for writer in range(WRITERS):  # each writer's saves landed, in the order it made them
                    own = [s.idempotency_key for s in kept if str(s.idempotency_key).startswith(f'{writer}-')]
                    assert own == [f'{writer}-{number}' for number in range(count)]
            else:
                older = [snapshot for snapshot in kept if snapshot.seq < newest_n[0]]
                newest_complete_kept = any(s.state == 'complete' for s in kept[-retention:])
                assert [s.state for s in older] == ([] if newest_complete_kept else ['complete'])
            latest = await store.latest_snapshot(run_id='shared')
            assert latest is not None and latest.seq == max(s.seq for s in kept if s.state == 'complete')

            # Every key stays used, also for pruned snapshots: saving them all again writes nothing.
            for writer in range(WRITERS):
                for number in range(count):
                    await store.save_snapshot(keyed_snapshot('shared', writer, number))
            assert await store.list_snapshots(run_id='shared', include_interrupted=True) == kept
