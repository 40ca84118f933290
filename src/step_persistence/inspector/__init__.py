"""The read-only web inspector behind `step-persistence serve` (the `inspector` extra).

`create_app(store, ...)` is an ASGI application over an open store: the runs, one run (lineage,
ledger, timeline, snapshots), a snapshot's messages, the conversations. See docs/inspector.md.
"""

from __future__ import annotations

try:
    from step_persistence.inspector.app import create_app
except ImportError as error:  # pragma: no cover - depends on what is installed
    if error.name not in ('starlette', 'jinja2', 'markupsafe'):
        raise
    raise ImportError("the inspector needs the 'inspector' extra: pip install 'step-persistence[inspector]'") from error

__all__ = ['create_app']
