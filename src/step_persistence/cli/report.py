"""`step-persistence report`: every run's summary and per-tool statistics."""

from __future__ import annotations

from step_persistence.cli._common import DEFAULT_STORE, JsonOption, StoreOption, console, open_store, print_json, run
from step_persistence.cli.render import summaries_table, tool_stats_table
from step_persistence.protocol import StepStore
from step_persistence.reporting import RunSummary, ToolStats, summarize_runs, tool_stats


async def _figures(store: StepStore) -> tuple[list[RunSummary], list[ToolStats]]:
    """From the reporting views on a SQL store (two queries); through the protocol on any other."""
    # Imported here: the other commands and other stores need no SQL machinery.
    from step_persistence.stores.sql.reporting import read_report
    from step_persistence.stores.sql.store import SqlStepStore

    if isinstance(store, SqlStepStore):
        return await read_report(store)
    return await summarize_runs(store), await tool_stats(store)


def report(store: StoreOption = DEFAULT_STORE, json_output: JsonOption = False) -> None:
    """Summarise every run (the run_summary figures) and every tool (the tool_call_stats figures)."""

    async def main() -> None:
        async with open_store(store) as opened:
            summaries, stats = await _figures(opened)
        if json_output:
            print_json({'runs': summaries, 'tools': stats})
        else:
            console.print(summaries_table(summaries))
            console.print(tool_stats_table(stats))

    run(main)
