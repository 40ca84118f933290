"""Every Python example in docs/ and README.md runs as written."""

from __future__ import annotations

import os
import re
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FENCE = re.compile(r'^```python\n(.*?)^```', re.MULTILINE | re.DOTALL)
SIGNATURE_ONLY = re.compile(r'^[A-Za-z_]+\($', re.MULTILINE)


def examples() -> list[tuple[str, str]]:
    found: list[tuple[str, str]] = []
    for page in sorted([*ROOT.joinpath('docs').glob('*.md'), ROOT / 'README.md']):
        for index, match in enumerate(FENCE.finditer(page.read_text())):
            code = match.group(1)
            if not SIGNATURE_ONLY.match(code):
                found.append((f'{page.name}#{index}', code))
    return found


@pytest.mark.parametrize(('where', 'code'), examples(), ids=[where for where, _ in examples()])
def test_example_runs(where: str, code: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    # Examples run the `step-persistence` command as a user's shell finds it: this interpreter's scripts first.
    monkeypatch.setenv('PATH', os.pathsep.join([str(Path(sys.executable).parent), os.environ.get('PATH', '')]))
    script = tmp_path / 'example.py'
    script.write_text(code)
    runpy.run_path(str(script), run_name='__main__')


def test_docs_build_strict(tmp_path: Path) -> None:
    """Every page is in the navigation and every link resolves (mkdocs --strict)."""
    completed = subprocess.run(
        [sys.executable, '-m', 'mkdocs', 'build', '--strict', '--site-dir', str(tmp_path / 'site')],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert completed.returncode == 0, completed.stderr
