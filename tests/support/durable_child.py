"""A child process of tests/durable/test_durable_crash.py: one run of the durable order workflow.

`python durable_child.py '<json>'` with `spec` (what `from_spec` opens), `run_id`, `calls` (a file each
model request and tool body appends its name to, before any crash), `crash_at` (`'charge'`: inside that
tool once its parallel sibling's unit completed; `'record:charge'`: after that tool's body returned, before
its unit is journaled `completed`; `'model:2'`: inside the second model request; `None`),
`idempotent_b` and `lease_seconds` (the leases' duration). With `delegate`, the run is the desk agent's, and the
order workflow its delegate (a child workflow): the crash points are the delegate's, and the parent's requests
are logged as `desk-model`. `os._exit(9)` at the crash point; otherwise prints the run's output and exits 0.
With `recover`, it runs `recover_abandoned` instead, once `<barrier>/go` exists if `barrier` names a directory
(it writes `<barrier>/ready-<pid>` first), and prints each workflow's outcome.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import anyio.to_thread

from step_persistence import from_spec
from step_persistence.durable import child_workflow_id, journal_for, recover_abandoned
from step_persistence.durable.records import DurableUnit
from support.durable_agents import DELEGATE_CALL, Calls, build_agent, build_delegating_agent

CRASH_STATUS = 9


def _append(calls: Path, label: str) -> None:
    with calls.open('a') as calls_log:
        calls_log.write(label + '\n')


async def _sibling_completed(store: Any, run_id: str) -> None:
    journal = journal_for(store)
    for _ in range(2000):
        units = await journal.list_units(workflow_id=run_id)
        if any(unit.tool_call_id == 'call-reserve' and unit.status == 'completed' for unit in units):
            return
        await asyncio.sleep(0.005)
    raise AssertionError('the sibling call never completed')


def _crash_before_recording_the_charge(store: Any) -> None:
    journal_class = type(journal_for(store))
    record_unit = journal_class.record_unit

    async def crash_before_completed(self: Any, unit: DurableUnit, **fenced: Any) -> None:
        if unit.tool_call_id == 'call-charge' and unit.status == 'completed':
            os._exit(CRASH_STATUS)
        await record_unit(self, unit, **fenced)

    journal_class.record_unit = crash_before_completed  # type: ignore[method-assign]


async def main(arguments: dict[str, Any]) -> None:
    calls_file = Path(arguments['calls'])
    crash_at = arguments['crash_at']
    run_id = arguments['run_id']
    delegate = arguments.get('delegate', False)
    orders_id = child_workflow_id(run_id, DELEGATE_CALL) if delegate else run_id
    async with from_spec(**arguments['spec']) as store:
        calls = Calls()

        def hook(name: str, label: str) -> Any:
            async def record() -> None:
                await anyio.to_thread.run_sync(_append, calls_file, label)
                if name == 'charge' and crash_at in ('charge', 'record:charge'):
                    await _sibling_completed(store, orders_id)
                if name == crash_at:
                    os._exit(CRASH_STATUS)

            return record

        calls.hooks.update({name: hook(name, name) for name in ('reserve', 'charge')})
        calls.hooks.update({f'model:{n}': hook(f'model:{n}', 'model') for n in range(1, 5)})
        if crash_at == 'record:charge':
            _crash_before_recording_the_charge(store)
        lease = timedelta(seconds=arguments.get('lease_seconds', 30))
        options = {'idempotent_b': arguments['idempotent_b'], 'lease_duration': lease}
        if delegate:
            desk = Calls()
            desk.hooks.update({f'model:{n}': hook(f'desk-model:{n}', 'desk-model') for n in range(1, 5)})
            agent = build_delegating_agent(store, desk, calls, **options)
        else:
            agent = build_agent(store, calls, **options)
        if arguments.get('recover'):
            await _at_barrier(arguments.get('barrier'))
            recoveries = await recover_abandoned(store, agents=[agent])
            print(json.dumps([[each.workflow_id, each.outcome, each.output] for each in recoveries]))
            return
        result = await agent.run('two items', run_id=run_id)
        print(json.dumps(result.output))


async def _at_barrier(barrier: str | None) -> None:
    """Say this process is ready, then wait for the test's go (so that racing processes start together)."""
    if barrier is None:
        return
    directory = Path(barrier)
    (directory / f'ready-{os.getpid()}').touch()
    for _ in range(12000):
        if (directory / 'go').exists():
            return
        await asyncio.sleep(0.005)
    raise AssertionError('the test never said go')


if __name__ == '__main__':
    asyncio.run(main(json.loads(sys.argv[1])))
