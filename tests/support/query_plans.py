"""What SQL a read sends, and whether its plans read indexes: for the tests that a read is served from indexes.

Asserted on the plans of the statements the store actually sends (captured from the engine, or
from a SQLite connection's trace), never on timings: SQLite's `EXPLAIN QUERY PLAN`, and
PostgreSQL's `EXPLAIN` with sequential scans, bitmap scans and sorts disabled, so that the planner
reads an index in order whenever one can answer the query (on small tables it would otherwise scan
and sort, which says nothing about large ones; a disabled node still appears when nothing else can
answer).
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from typing import Any

from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncEngine

from step_persistence.stores.sql.schema import TABLES as SCHEMA

__all__ = [
    'STORE_TABLES',
    'Captured',
    'assert_no_full_scan',
    'assert_no_sort',
    'assert_uses_index',
    'full_scans',
    'query_plan',
    'query_plans',
    'statements_sent_by',
    'unkeyed_index_walks',
]

Captured = list[tuple[str, Any]]

STORE_TABLES = tuple(sorted(SCHEMA.tables))
"""Every table of the store's schema."""


async def statements_sent_by(
    engine: AsyncEngine, read: Callable[[], Awaitable[object]], *, kinds: tuple[str, ...] = ('SELECT',)
) -> Captured:
    """The statements of `kinds` (with their driver parameters) that `read` sends through `engine`."""
    captured: Captured = []

    def capture(connection: Any, cursor: Any, statement: str, parameters: Any, context: Any, many: bool) -> None:
        if statement.lstrip().upper().startswith(kinds):
            captured.append((statement, parameters))

    event.listen(engine.sync_engine, 'before_cursor_execute', capture)
    try:
        await read()
    finally:
        event.remove(engine.sync_engine, 'before_cursor_execute', capture)
    assert captured, 'the read sent no statement'
    return captured


async def query_plan(engine: AsyncEngine, statement: str, parameters: Any) -> str:
    """The plan of one captured statement, as text (one line per plan node)."""
    async with engine.connect() as connection:
        if engine.dialect.name == 'sqlite':
            found = await connection.exec_driver_sql(f'EXPLAIN QUERY PLAN {statement}', parameters)
            return '\n'.join(str(row[-1]) for row in found)
        for setting in ('enable_seqscan', 'enable_bitmapscan', 'enable_sort'):
            await connection.exec_driver_sql(f'SET {setting} = off')
        found = await connection.exec_driver_sql(f'EXPLAIN {statement}', parameters)
        return '\n'.join(str(row[0]) for row in found)


async def query_plans(
    engine: AsyncEngine, read: Callable[[], Awaitable[object]], *, kinds: tuple[str, ...] = ('SELECT',)
) -> list[str]:
    """The plan of every statement of `kinds` that `read` sends."""
    captured = await statements_sent_by(engine, read, kinds=kinds)
    return [await query_plan(engine, statement, parameters) for statement, parameters in captured]


def full_scans(plan: str, tables: tuple[str, ...] = STORE_TABLES) -> list[str]:
    """The plan nodes that read every row of one of `tables` (SQLite: `SCAN table` with no index; PostgreSQL:
    `Seq Scan on table`)."""
    found: list[str] = []
    for table in tables:
        found += re.findall(rf'^SCAN {table}\b(?! USING (?:COVERING )?INDEX).*$', plan, re.MULTILINE)
        found += re.findall(rf'Seq Scan on {table}\b.*$', plan, re.MULTILINE)
    return found


def assert_no_full_scan(plan: str, table: str) -> None:
    """No plan node reads every row of `table`."""
    assert not full_scans(plan, (table,)), plan


def assert_uses_index(plan: str, table: str, index: str) -> None:
    """`table` is read through `index` (SQLite: SEARCH/SCAN ... USING INDEX; PostgreSQL: an index scan)."""
    sqlite = re.search(rf'^(SEARCH|SCAN) {table} USING (COVERING )?INDEX {index}\b', plan, re.MULTILINE)
    postgres = re.search(rf'(Index Scan|Index Only Scan|Bitmap Index Scan)( Backward)? (using|on) {index}\b', plan)
    assert sqlite is not None or postgres is not None, plan
    assert_no_full_scan(plan, table)


def assert_no_sort(plan: str) -> None:
    """The index gives the order: no temporary B-tree (SQLite) or sort node (PostgreSQL)."""
    assert 'USE TEMP B-TREE FOR ORDER BY' not in plan, plan
    assert not re.search(r'^\s*(->\s*)?(Incremental )?Sort\b', plan, re.MULTILINE), plan


_POSTGRES_NODE = re.compile(r'^(\s*)(?:->\s+)?(.*)$')


def unkeyed_index_walks(plan: str) -> list[str]:
    """The plan nodes that walk an index from one end without a key to seek (all of it, unless a LIMIT stops them).

    SQLite says `SCAN table USING [COVERING] INDEX ix` (against `SEARCH ... (column=?)`); PostgreSQL, an
    index scan node with no `Index Cond` among its details.
    """
    lines = plan.splitlines()
    walks = [line for line in lines if re.match(r'^SCAN \S+ USING (COVERING )?INDEX\b', line)]
    for at, line in enumerate(lines):
        if not re.search(r'\bIndex (Only )?Scan\b', line):
            continue
        indent = len(_POSTGRES_NODE.match(line).group(1))  # type: ignore[union-attr]
        details = []
        for following in lines[at + 1 :]:
            if following.lstrip().startswith('->') or len(following) - len(following.lstrip()) <= indent:
                break
            details.append(following.strip())
        if not any(detail.startswith('Index Cond:') for detail in details):
            walks.append(line.strip())
    return walks
