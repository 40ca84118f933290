"""Start several writer processes at the same moment and wait for all of them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

WRITER = Path(__file__).with_name('writer.py')


def write_concurrently(spec: dict[str, Any], prefixes: list[str], count: int, *, script: Path = WRITER) -> None:
    """Run one `script` (default `writer.py`) per prefix, with arguments `SPEC_JSON PREFIX COUNT`; all
    are released together once every one has imported."""
    writers = [
        subprocess.Popen(
            [sys.executable, str(script), json.dumps(spec), prefix, str(count)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for prefix in prefixes
    ]
    try:
        for writer in writers:
            assert writer.stdout is not None
            assert writer.stdout.readline().strip() == 'ready', writer.stderr.read() if writer.stderr else ''
        for writer in writers:
            assert writer.stdin is not None
            writer.stdin.write('go\n')
            writer.stdin.flush()
        for writer in writers:
            stdout, stderr = writer.communicate(timeout=120)
            assert writer.returncode == 0, stderr
            assert stdout.strip() == 'done'
    finally:
        for writer in writers:
            if writer.poll() is None:
                writer.kill()
                writer.wait()
