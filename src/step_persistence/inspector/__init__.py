"""The read-only web inspector behind `step-persistence serve` (the `inspector` extra).

`create_app(store, ...)` is an ASGI application over an open store: the runs, one run (lineage,
ledger, timeline, snapshots), a snapshot's messages, the conversations. See docs/inspector.md.
It is imported on first use, so `inspector.binding` (what `serve` checks first) imports no web
stack, and a missing extra is said when `create_app` is asked for.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from step_persistence.inspector.app import create_app

__all__ = ['create_app']

_EXTRA = ('starlette', 'jinja2', 'markupsafe')


def __getattr__(name: str) -> Any:
    if name != 'create_app':
        raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
    try:
        from step_persistence.inspector.app import create_app
    except ImportError as error:
        if error.name not in _EXTRA:
            raise
        raise ImportError(
            "the inspector needs the 'inspector' extra: pip install 'step-persistence[inspector]'"
        ) from error
    return create_app
