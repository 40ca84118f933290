"""`step-persistence report`: every run's summary and per-tool statistics."""

from __future__ import annotations

from step_persistence.cli._common import DEFAULT_STORE, JsonOption, StoreOption, console, open_store, print_json, run
from step_persistence.cli.render import summaries_table, tool_stats_table
from step_persistence.reporting import summarize_runs, tool_stats


def report(store: StoreOption = DEFAULT_STORE, json_output: JsonOption = False) -> None:
    """Summarise every run (the run_summary figures) and every tool (the tool_call_stats figures)."""

    async def main() -> None:
        async with open_store(store) as opened:
            summaries = await summarize_runs(opened)
            stats = await tool_stats(opened)
        if json_output:
            print_json({'runs': summaries, 'tools': stats})
        else:
            console.print(summaries_table(summaries))
            console.print(tool_stats_table(stats))

    run(main)
