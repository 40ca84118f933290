"""A separate OS process that saves snapshots of one shared run, for the cross-process message tests.

Usage: python shared_run_writer.py SPEC_JSON WRITER COUNT. Prints `ready` once imported, waits for
one line on stdin (so that every writer starts at the same moment), saves COUNT snapshots of the
run `shared` (registered beforehand) with the histories `history_for(step_index)` names, then
prints `done`. Writers share the first messages of their histories and differ in the newest, as
pydantic-ai's histories do when the newest message is completed in place.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pydantic_ai.messages import ModelMessage, ModelRequest, UserPromptPart

from step_persistence import ContinuableSnapshot, from_spec
from step_persistence.testing.conformance import T0, sample_history

RUN_ID = 'shared'
SCRIPT = Path(__file__)


def step_index(writer: int, step: int) -> int:
    return writer * 100 + step


def history_for(step_index: int) -> list[ModelMessage]:
    """The history a writer saves at a step: a common prefix, `step` common prompts, then its own newest."""
    writer, step = divmod(step_index, 100)

    def prompt(content: str) -> ModelRequest:
        return ModelRequest(parts=[UserPromptPart(content=content, timestamp=T0)])

    common = [prompt(f'step {number}') for number in range(step)]
    return [*sample_history(2, tag=RUN_ID), *common, prompt(f'writer {writer} at step {step}')]


async def write(spec: dict[str, object], writer: int, count: int) -> None:
    async with from_spec(**spec) as store:
        for step in range(1, count + 1):
            index = step_index(writer, step)
            await store.save_snapshot(ContinuableSnapshot(run_id=RUN_ID, step_index=index, messages=history_for(index)))


if __name__ == '__main__':
    print('ready', flush=True)
    sys.stdin.readline()
    asyncio.run(write(json.loads(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])))
    print('done', flush=True)
