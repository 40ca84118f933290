"""`prune_runs` for the stores that find old runs by listing them all (the in-memory and file stores)."""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime

from step_persistence import lifecycle
from step_persistence.protocol import StepStore
from step_persistence.records import RunStatus

__all__ = ['PrunesFromListing']


class PrunesFromListing:
    """A `StepStore.prune_runs` that judges every run of `list_runs()` and deletes through `delete_run`."""

    async def prune_runs(
        self: StepStore,
        *,
        older_than: datetime,
        statuses: Collection[RunStatus] | None = None,
        include_running: bool = False,
    ) -> list[str]:
        """Delete old runs (see `StepStore.prune_runs`); lists every run to find them."""
        return await lifecycle.prune_runs(
            self, older_than=older_than, statuses=statuses, include_running=include_running
        )
