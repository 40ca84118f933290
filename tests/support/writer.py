"""A separate OS process that writes runs through `from_spec(**spec)`, for the concurrency tests.

Usage: python writer.py SPEC_JSON PREFIX COUNT. Prints `ready` once imported, waits for one line
on stdin (so that every writer starts at the same moment), writes COUNT runs named PREFIX-<n>,
each with three events, two snapshots and a tool effect, then prints `done`.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from step_persistence import ContinuableSnapshot, RunRecord, StepEvent, ToolEffectRecord, from_spec
from step_persistence.testing.conformance import sample_history


async def write(spec: dict[str, object], prefix: str, count: int) -> None:
    async with from_spec(**spec) as store:
        for number in range(count):
            run_id = f'{prefix}-{number}'
            await store.register_run(RunRecord(run_id=run_id, conversation_id=prefix))
            for step, kind in enumerate(('run_started', 'model_request_started', 'run_completed')):
                await store.append_event(StepEvent(run_id=run_id, kind=kind, step_index=step, idempotency_key=kind))
            for step in (1, 2):
                await store.save_snapshot(
                    ContinuableSnapshot(run_id=run_id, step_index=step, messages=sample_history(step, tag=run_id))
                )
            await store.record_tool_effect(
                ToolEffectRecord(run_id=run_id, tool_call_id='t', tool_name='lookup', status='completed')
            )


if __name__ == '__main__':
    print('ready', flush=True)
    sys.stdin.readline()
    asyncio.run(write(json.loads(sys.argv[1]), sys.argv[2], int(sys.argv[3])))
    print('done', flush=True)
