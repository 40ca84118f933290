"""A separate OS process that saves snapshots reusing a blob, for the cross-process collection test.

Usage: python media_writer.py SPEC_JSON COUNT. Prints `ready` once imported, waits for one line on
stdin, saves COUNT snapshots of the run `live` (registered beforehand) with the histories
`history_for(step)` gives (each reuses the blob `SHARED` and adds one of its own), then prints
`done`.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pydantic_ai.messages import BinaryContent, ModelMessage, ModelRequest, ModelResponse, TextPart, UserPromptPart

from step_persistence import ContinuableSnapshot, from_spec
from step_persistence.testing.conformance import T0

RUN_ID = 'live'
SCRIPT = Path(__file__)
SHARED = b'shared payload ' * 8000


def payload(tag: str) -> bytes:
    return tag.encode() * 10_000


def history_for(step: int) -> list[ModelMessage]:
    """A prompt, then per earlier step a response and a request carrying `SHARED` and the step's own payload."""
    history: list[ModelMessage] = [ModelRequest(parts=[UserPromptPart(content='start', timestamp=T0)])]
    for number in range(1, step + 1):
        images = [BinaryContent(data=data, media_type='image/png') for data in (SHARED, payload(f'step {number}'))]
        history.append(ModelResponse(parts=[TextPart(content=f'look {number}')], timestamp=T0))
        history.append(ModelRequest(parts=[UserPromptPart(content=[f'see {number}', *images], timestamp=T0)]))
    return history


async def write(spec: dict[str, object], count: int) -> None:
    async with from_spec(**spec) as store:
        for step in range(1, count + 1):
            await store.save_snapshot(ContinuableSnapshot(run_id=RUN_ID, step_index=step, messages=history_for(step)))


if __name__ == '__main__':
    print('ready', flush=True)
    sys.stdin.readline()
    asyncio.run(write(json.loads(sys.argv[1]), int(sys.argv[2])))
    print('done', flush=True)
