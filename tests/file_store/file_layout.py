"""Where a file store's test finds a run's history on disk: the line its snapshots are on."""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ['line_of', 'message_lines', 'messages_of', 'stored_message_lines']


def line_of(root: Path, run_id: str, seq: int | None = None) -> Path:
    """The directory of the line snapshot `seq` of `run_id` is on (its newest snapshot's by default)."""
    journal = [json.loads(line) for line in (root / run_id / 'snapshots.jsonl').read_text().splitlines()]
    entry = journal[-1] if seq is None else next(line for line in journal if line['seq'] == seq)
    return root / '@lines' / entry['view']['line']


def messages_of(root: Path, run_id: str, seq: int | None = None) -> Path:
    """The `messages.jsonl` of the line of snapshot `seq` of `run_id` (see `line_of`)."""
    return line_of(root, run_id, seq) / 'messages.jsonl'


def message_lines(root: Path, run_id: str) -> list[bytes]:
    """The lines of the `messages.jsonl` of the run's newest snapshot's line."""
    return messages_of(root, run_id).read_bytes().splitlines()


def stored_message_lines(root: Path) -> int:
    """Message lines in every history line of the store at `root`."""
    return sum(len(path.read_bytes().splitlines()) for path in root.glob('@lines/*/messages.jsonl'))
