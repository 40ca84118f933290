"""docs/inspector.md shows every screenshot `make screenshots` writes, and each is a real image of a page."""

from __future__ import annotations

import re
import struct
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / 'docs'
SHOTS = ('runs', 'crashed-run', 'run', 'messages', 'conversation')
"""The pages tests/support/inspector_screenshots.py takes, as `docs/images/inspector-<name>.png`."""


def _size(png: bytes) -> tuple[int, int]:
    assert png[:8] == b'\x89PNG\r\n\x1a\n' and png[12:16] == b'IHDR', 'a PNG file'
    width, height = struct.unpack('>II', png[16:24])
    return width, height


def test_every_screenshot_is_shown_and_exists() -> None:
    shown = set(re.findall(r'!\[[^\]]*\]\((images/inspector-[a-z-]+\.png)\)', (DOCS / 'inspector.md').read_text()))
    assert shown == {f'images/inspector-{name}.png' for name in SHOTS}
    on_disk = {path.relative_to(DOCS).as_posix() for path in (DOCS / 'images').glob('inspector-*.png')}
    assert on_disk == shown
    script = (ROOT / 'tests' / 'support' / 'inspector_screenshots.py').read_text()
    for name in SHOTS:
        assert f"'inspector-{name}.png'" in script, name
        width, height = _size((DOCS / f'images/inspector-{name}.png').read_bytes())
        assert width == 1280 and height >= 800, (name, width, height)
