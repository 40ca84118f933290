"""`prune_runs`, written once for every store: each store only says how it finds old runs."""

from __future__ import annotations

from collections.abc import Collection, Iterable
from datetime import datetime
from typing import cast

from step_persistence import lifecycle
from step_persistence.protocol import StepStore
from step_persistence.records import RunRecord, RunStatus, require_utc

__all__ = ['PrunesOldRuns']


class PrunesOldRuns:
    """A `StepStore.prune_runs` that judges the runs `runs_started_before` finds and deletes through `delete_run`.

    Arguments are validated before the store is read. A store with an index on `started_at`
    overrides `runs_started_before`; by default every run of `list_runs()` is judged.
    """

    async def runs_started_before(self, cutoff: datetime) -> Iterable[RunRecord] | None:
        """The runs that started before `cutoff`, oldest first; `None`: judge every run of `list_runs()`.

        For step_persistence's own use (the stores' `prune_runs`).
        """
        return None

    async def prune_runs(
        self,
        *,
        older_than: datetime,
        statuses: Collection[RunStatus] | None = None,
        include_running: bool = False,
    ) -> list[str]:
        """Delete old runs (see `StepStore.prune_runs`)."""
        cutoff = require_utc(older_than)
        lifecycle.validate_statuses(statuses)
        return await lifecycle.prune_runs(
            cast(StepStore, self),
            older_than=cutoff,
            statuses=statuses,
            include_running=include_running,
            candidates=await self.runs_started_before(cutoff),
        )
