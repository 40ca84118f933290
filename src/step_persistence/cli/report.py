"""`step-persistence report`: every run's summary and per-tool statistics."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from step_persistence.cli._common import DEFAULT_STORE, JsonOption, StoreOption, open_store, print_json, run

if TYPE_CHECKING:
    from step_persistence.protocol import StepStore
    from step_persistence.reporting import RunSummary, ToolStats

__all__ = ['report']


async def _figures(store: StepStore) -> tuple[list[RunSummary], list[ToolStats]]:
    """From the reporting views on a SQL store (two queries); through the protocol on any other."""
    # A store can only be a SqlStepStore once that module is imported: looking it up keeps the other
    # stores from importing SQLAlchemy to find out.
    sql = sys.modules.get('step_persistence.stores.sql.store')
    if sql is not None and isinstance(store, sql.SqlStepStore):
        from step_persistence.stores.sql.reporting import read_report

        return await read_report(store)
    from step_persistence.reporting import summarize_runs, tool_stats

    return await summarize_runs(store), await tool_stats(store)


def report(store: StoreOption = DEFAULT_STORE, json_output: JsonOption = False) -> None:
    """Summarise every run (the run_summary figures) and every tool (the tool_call_stats figures)."""

    async def main() -> tuple[list[RunSummary], list[ToolStats]]:
        async with open_store(store) as opened:
            return await _figures(opened)

    summaries, stats = run(main)
    if json_output:
        print_json({'runs': summaries, 'tools': stats})
        return
    from step_persistence.cli.tables import RUNS, TOOLS, show

    show(RUNS, summaries)
    show(TOOLS, stats)
