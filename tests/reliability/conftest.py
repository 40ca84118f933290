from __future__ import annotations

from collections.abc import Iterator

import pytest

from support.crash_driver import Zygote


@pytest.fixture(scope='session')
def zygote(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Zygote]:
    """One zygote process for the reliability suite (its import and warm-up are paid once)."""
    started = Zygote(tmp_path_factory.mktemp('zygote') / 'children.log')
    try:
        yield started
    finally:
        started.close()
