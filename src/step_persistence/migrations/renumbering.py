"""The data half of downgrading revision 0005: each run's messages numbered on its own again, as 0004 had them.

Revision 0004 numbered message rows per run, and a snapshot's view was `(run, history_length,
through_message)`. `renumber_per_run` reads every retained snapshot's view of its line (through
the line's bases, as revision 0005's stores read it), then replays each run's snapshots in `seq`
order: a row for each position whose message differs from the run's previous snapshot, numbered
after it, exactly as a 0004 store would have written them. `insert_renumbered` writes the result
once `messages` has its 0004 shape again. It reads the data, so it runs online only.

Written against the tables of revision 0005 as they are, independently of the store's code, so
that later changes to the store never change what this migration does.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa
from alembic.util import CommandError
from sqlalchemy.engine import Connection

from step_persistence.stores.sql.naming import TableNames
from step_persistence.stores.sql.types import EncodedJSON

__all__ = ['Renumbered', 'insert_renumbered', 'renumber_per_run']


@dataclass(frozen=True)
class _Statements:
    """The statements of the renumbering, on the tables `names` names."""

    snapshots: sa.TextClause
    base: sa.TextClause
    segment: sa.TextClause
    messages: sa.Table
    through: sa.TextClause
    counter: sa.TextClause

    @classmethod
    def on(cls, names: TableNames) -> _Statements:
        snapshots, lines, messages, runs = (
            names.table(name) for name in ('snapshots', 'history_lines', 'messages', 'runs')
        )
        return cls(
            snapshots=sa.text(
                f'SELECT run_id, seq, line_id, history_length, through_message FROM {snapshots} ORDER BY run_id, seq'
            ),
            base=sa.text(f'SELECT base_line_id, base_length, base_through FROM {lines} WHERE id = :line'),
            segment=sa.text(
                f'SELECT m.position, m.digest, CAST(m.body AS TEXT), m.externalized FROM {messages} m '
                'WHERE m.line_id = :line AND m.position >= 0 AND m.position < :length AND m.no = ('
                f'SELECT max(v.no) FROM {messages} v WHERE v.line_id = m.line_id AND v.position = m.position '
                'AND v.no <= :through)'
            ),
            messages=sa.Table(
                messages,
                sa.MetaData(),
                sa.Column('run_id', sa.String()),
                sa.Column('no', sa.BigInteger()),
                sa.Column('position', sa.Integer()),
                sa.Column('digest', sa.String(64)),
                sa.Column('body', EncodedJSON()),
                sa.Column('externalized', sa.Boolean()),
            ),
            through=sa.text(f'UPDATE {snapshots} SET through_message = :through WHERE run_id = :run_id AND seq = :seq'),
            counter=sa.text(f'UPDATE {runs} SET last_message_no = :last_message_no WHERE run_id = :run_id'),
        )


_Row = tuple[str, str, bool]
"""`(digest, body, externalized)` of one message of a view."""


@dataclass
class Renumbered:
    """What `messages`, `snapshots.through_message` and `runs.last_message_no` hold after the downgrade."""

    messages: list[dict[str, Any]] = field(default_factory=list[dict[str, Any]])
    throughs: list[dict[str, Any]] = field(default_factory=list[dict[str, Any]])
    counters: list[dict[str, Any]] = field(default_factory=list[dict[str, Any]])


def renumber_per_run(connection: Connection, names: TableNames) -> Renumbered:
    """Replay every run's retained snapshots into per-run rows (see the module docstring).

    A view whose rows are missing (damaged before the downgrade) gives its snapshot the rows found
    and leaves it unreadable, as it was.
    """
    if not isinstance(connection, Connection):
        raise CommandError('downgrading revision 0005 reads the stored histories: run it online, not with --sql')
    statements = _Statements.on(names)
    renumbered = Renumbered()
    bases: dict[int, tuple[int, int, int] | None] = {}
    run_id: str | None = None
    latest: list[str] = []
    number = 0
    for snapshot_run, seq, line, length, through in connection.execute(statements.snapshots).all():
        if snapshot_run != run_id:
            if run_id is not None:
                renumbered.counters.append({'run_id': run_id, 'last_message_no': number})
            run_id, latest, number = snapshot_run, [], 0
        view = _view(connection, statements, (line, length, through), bases)
        for position, found in sorted(view.items()):
            digest, body, externalized = found
            if position < len(latest) and latest[position] == digest:
                continue
            number += 1
            renumbered.messages.append(
                {
                    'run_id': run_id,
                    'no': number,
                    'position': position,
                    'digest': digest,
                    'body': body,
                    'externalized': externalized,
                }
            )
            latest.extend([''] * (position + 1 - len(latest)))
            latest[position] = digest
        del latest[length:]
        renumbered.throughs.append({'run_id': run_id, 'seq': seq, 'through': number})
    if run_id is not None:
        renumbered.counters.append({'run_id': run_id, 'last_message_no': number})
    return renumbered


def _view(
    connection: Connection,
    statements: _Statements,
    view: tuple[int | None, int, int],
    bases: dict[int, tuple[int, int, int] | None],
) -> dict[int, _Row]:
    """Per position of the view `(line, length, through)`, its message: from the line, else from its bases."""
    line, length, through = view
    found: dict[int, _Row] = {}
    seen: set[int] = set()
    while line is not None and line not in seen:
        seen.add(line)
        parameters = {'line': line, 'length': length, 'through': through}
        for position, digest, body, externalized in connection.execute(statements.segment, parameters):
            found.setdefault(position, (digest, body, bool(externalized)))
        if line not in bases:
            base = connection.execute(statements.base, {'line': line}).first()
            bases[line] = None if base is None or base[0] is None else (base[0], base[1], base[2])
        chained = bases[line]
        if chained is None:
            break
        line, length, through = chained[0], min(chained[1], length), chained[2]
    return found


def insert_renumbered(connection: Connection, renumbered: Renumbered, names: TableNames) -> None:
    """Write the rows and numbers `renumber_per_run` found (into `messages` of revision 0004's shape)."""
    statements = _Statements.on(names)
    if renumbered.messages:
        connection.execute(statements.messages.insert(), renumbered.messages)
    if renumbered.throughs:
        connection.execute(statements.through, renumbered.throughs)
    if renumbered.counters:
        connection.execute(statements.counter, renumbered.counters)
