"""The `jq` line of docs/file-store.md prints a snapshot's messages, run as written against a real store.

(Its Python equivalent, which also follows line bases, is an example of that page and runs with
the other examples in tests/docs/.)
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from pydantic_ai.messages import (
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelRequest,
    ModelResponse,
    TextPart,
    UserPromptPart,
)

from file_store.file_layout import line_of
from step_persistence import ContinuableSnapshot, FileStepStore, RunRecord
from step_persistence.records import RunOrigin

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(
        shutil.which('jq') is None, reason='jq is not installed (docs/file-store.md has a Python equivalent)'
    ),
]

PAGE = Path(__file__).resolve().parents[2] / 'docs' / 'file-store.md'


def jq_snippet() -> str:
    """The page's bash block that prints a snapshot's messages."""
    [block] = [code for code in re.findall(r'^```bash\n(.*?)^```', PAGE.read_text(), re.M | re.S) if '$SEQ' in code]
    return block


def printed(root: Path, run_id: str, seq: int) -> list[ModelMessage]:
    completed = subprocess.run(
        ['bash', '-euo', 'pipefail', '-c', jq_snippet()],
        cwd=root.parent,
        env={'PATH': '/usr/bin:/bin:/usr/local/bin', 'RUN': run_id, 'SEQ': str(seq)},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return ModelMessagesTypeAdapter.validate_python(json.loads(completed.stdout))


def ask(text: str) -> ModelRequest:
    return ModelRequest(parts=[UserPromptPart(content=text)])


def say(text: str) -> ModelResponse:
    return ModelResponse(parts=[TextPart(content=text)])


def dump(messages: list[ModelMessage]) -> bytes:
    return ModelMessagesTypeAdapter.dump_json(messages)


async def test_the_jq_line_prints_each_snapshot_of_a_chat(tmp_path: Path) -> None:
    root = tmp_path / 'runs'
    store = FileStepStore(root, fsync=False)
    first = [ask('Where is ThinkingPartDelta?'), say('Looking ✓')]
    revised = [ask('Where is ThinkingPartDelta?'), say('In messages.py.'), ask('And ThinkingPart?'), say('Same.')]
    await store.register_run(RunRecord(run_id='turn-1', conversation_id='chat'))
    await store.save_snapshot(ContinuableSnapshot(run_id='turn-1', step_index=1, messages=first))
    await store.save_snapshot(ContinuableSnapshot(run_id='turn-1', step_index=2, messages=revised))
    origin = RunOrigin(kind='continued', run_id='turn-1', seq=2)
    await store.register_run(RunRecord(run_id='turn-2', conversation_id='chat', origin=origin))
    second = [*revised, ask('Thanks'), say('You are welcome.')]
    await store.save_snapshot(ContinuableSnapshot(run_id='turn-2', step_index=1, messages=second))

    lines = {
        json.loads((root / run / 'snapshots' / '1.json').read_text())['history']['line'] for run in ('turn-1', 'turn-2')
    }
    assert len(lines) == 1, 'the chat is one line: the case the jq line covers'
    for run_id, seq, expected in (('turn-1', 1, first), ('turn-1', 2, revised), ('turn-2', 1, second)):
        assert dump(printed(root, run_id, seq)) == dump(expected)
        stored = await store.list_snapshots(run_id=run_id)
        assert dump(printed(root, run_id, seq)) == dump(next(s for s in stored if s.seq == seq).messages)


async def test_the_jq_line_is_only_the_own_line_of_a_branch(tmp_path: Path) -> None:
    """What the page says: a branch also takes positions from its base, which the jq line does not follow."""
    root = tmp_path / 'runs'
    store = FileStepStore(root, fsync=False)
    first = [ask('one'), say('two')]
    await store.register_run(RunRecord(run_id='chat'))
    await store.save_snapshot(ContinuableSnapshot(run_id='chat', step_index=1, messages=first))
    await store.save_snapshot(ContinuableSnapshot(run_id='chat', step_index=2, messages=[*first, ask('went on')]))
    await store.register_run(RunRecord(run_id='fork', origin=RunOrigin(kind='forked', run_id='chat', seq=1)))
    forked = [*first, ask('three')]
    await store.save_snapshot(ContinuableSnapshot(run_id='fork', step_index=1, messages=forked))
    base = json.loads((line_of(root, 'fork') / 'line.json').read_text())['base']
    assert base is not None and base['line'] == line_of(root, 'chat').name
    assert dump(printed(root, 'fork', 1)) == dump(forked[2:]), 'positions 0 and 1 are in the base line'
