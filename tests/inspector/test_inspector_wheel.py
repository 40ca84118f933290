"""The inspector's templates and static files ship in the wheel (no build step, nothing fetched at run time)."""

from __future__ import annotations

import zipfile
from pathlib import Path

from support.wheel import ROOT, build_wheel

PACKAGE = ROOT / 'src' / 'step_persistence' / 'inspector'


def test_the_wheel_holds_every_template_and_static_file(tmp_path: Path) -> None:
    assets = {
        path.relative_to(ROOT / 'src').as_posix()
        for folder in ('templates', 'static')
        for path in (PACKAGE / folder).rglob('*')
        if path.is_file()
    }
    assert {
        'step_persistence/inspector/static/inspector.css',
        'step_persistence/inspector/static/inspector.js',
        'step_persistence/inspector/static/favicon.svg',
    } <= assets
    assert 'step_persistence/inspector/templates/run.html' in assets
    with zipfile.ZipFile(build_wheel(tmp_path)) as wheel:
        shipped = set(wheel.namelist())
        assert assets <= shipped, sorted(assets - shipped)
        for name in assets:
            assert wheel.read(name) == (ROOT / 'src' / name).read_bytes(), name
