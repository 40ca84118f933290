"""A cancellation landing at every point of a run leaves a consistent, continuable record.

The run is cancelled after 0, 1, 2, ... turns of the event loop, until the cancellation lands
where the run waits forever (in its second model request, or in a hanging tool): every point
the run passes through in between (registration, its first model request, the tool call and the
node transitions around them) is hit by one of the sweeps. The record is audited whole each time.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from test_entry_points import LOOKUP, Script, hanging_tool_agent, persisted, text

from step_persistence import InMemoryStepStore
from support.audit import audit_run

pytestmark = pytest.mark.anyio

# The sweeps stop once this many cancellations in a row landed where the run waits forever.
LANDED_AT_THE_END = 3
# How long a run task left running on its own gets to write the end of its record.
ORPHAN_GRACE = 2.0


async def teardown_finished(before: set[asyncio.Task[Any]]) -> None:
    """Let the tasks the run started finish, then cancel those that wait forever.

    A cancellation landing as `agent.run` starts its run task leaves that task running on its own
    (pydantic-ai's window between creating the task and awaiting it): it writes the record's end,
    then waits forever in the model or the tool, like the run it is.
    """
    started = asyncio.all_tasks() - before - {asyncio.current_task()}
    if started:
        _, waiting = await asyncio.wait(started, timeout=ORPHAN_GRACE)
        for task in waiting:
            task.cancel()
        await asyncio.gather(*waiting, return_exceptions=True)


@pytest.mark.parametrize('anyio_backend', ['asyncio'])
@pytest.mark.parametrize('blocked_in', ['model request', 'tool'])
async def test_a_cancellation_at_every_point_of_a_run(blocked_in: str) -> None:
    problems: list[str] = []
    at_the_end, ticks = 0, 0
    while at_the_end < LANDED_AT_THE_END:
        store = InMemoryStepStore()
        entered = asyncio.Event()
        if blocked_in == 'tool':
            agent = await hanging_tool_agent(store, entered)
        else:
            script = Script([LOOKUP, text('never')], block_at=1)
            agent, entered = persisted(store, script), script.entered
        before = asyncio.all_tasks()
        task = asyncio.create_task(agent.run('go', conversation_id='sweep'))
        for _ in range(ticks):
            await asyncio.sleep(0)
        at_the_end = at_the_end + 1 if entered.is_set() else 0
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await teardown_finished(before)
        for run in await store.list_runs():
            try:
                await audit_run(store, run.run_id)
            except AssertionError as error:
                problems.append(f'cancelled after {ticks} turns: {error}')
        ticks += 1
    assert ticks > LANDED_AT_THE_END + 10, 'the run reached its end too soon for a sweep'
    assert not problems, '\n'.join(problems)
