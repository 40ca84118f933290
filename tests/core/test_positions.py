"""The position model shared by every durable store: heads, planned saves, changed positions."""

from __future__ import annotations

import logging

import pytest

from step_persistence.stores._positions import (
    LineBase,
    NumberedRow,
    RunHead,
    ViewSegment,
    assemble,
    changed_positions,
    plan_saves,
    plausible_position,
    view_segments,
)


def test_changed_positions_are_the_differing_and_the_new_ones() -> None:
    assert changed_positions(['a', 'b', 'c'], ['a', 'b']) == [2]
    assert changed_positions(['a', 'x', 'c', 'd'], ['a', 'b', 'c']) == [1, 3]
    assert changed_positions(['a'], ['a', 'b']) == []
    assert changed_positions(['a', 'b'], [None, 'b']) == [0]


def test_a_plan_numbers_each_history_after_the_head_and_the_previous_ones() -> None:
    head = RunHead(incarnation=7, last_no=2, latest=['p', 'r1'])
    plan = plan_saves(head, [['p', 'r1', 'q1'], ['p', 'r1', 'q1b', 'r2'], ['p']])
    assert plan.rows == [NumberedRow(3, 2, 'q1'), NumberedRow(4, 2, 'q1b'), NumberedRow(5, 3, 'r2')]
    assert plan.throughs == [3, 5, 5]
    assert plan.ends == [1, 3, 3]
    assert [plan.added(index) for index in range(3)] == [plan.rows[:1], plan.rows[1:3], []]
    assert (head.last_no, head.latest) == (2, ['p', 'r1'])  # planning leaves the head alone


def test_advancing_a_head_with_a_plan_makes_the_next_plan_empty() -> None:
    head = RunHead(incarnation=1)
    histories = [['p', 'r'], ['p', 'r', 'q']]
    plan = plan_saves(head, histories)
    head.advance(plan.rows, through=plan.throughs[-1], length=3)
    assert (head.last_no, head.latest) == (3, ['p', 'r', 'q'])
    assert plan_saves(head, histories[-1:]).rows == []


def test_a_head_is_exactly_the_view_saved_so_a_regrown_position_is_written_again() -> None:
    head = RunHead(incarnation=1, line=5)
    plan = plan_saves(head, [['p', 'r', 'q'], ['p']])
    head.advance(plan.rows, through=plan.throughs[-1], length=1)
    assert head.latest == ['p']
    # The row of 'r' at position 1 is no longer in the view: the next view must not rely on it.
    assert plan_saves(head, [['p', 'r']]).rows == [NumberedRow(4, 1, 'r')]


def test_a_branch_starts_from_the_view_and_numbers_from_one() -> None:
    head = RunHead(incarnation=1, line=5, last_no=9, latest=['p', 'r'])
    assert head.base() == LineBase(line=5, length=2, through=9)
    branch = head.branched(6)
    assert (branch.line, branch.last_no, branch.latest) == (6, 0, ['p', 'r'])
    rows = plan_saves(branch, [['p', 'r', 'x']]).rows
    assert rows == [NumberedRow(1, 2, 'x')]
    branch.advance(rows, through=1, length=3)  # row 1 holds position 2, above the base: not damaged
    assert (branch.last_no, branch.latest, branch.base_length) == (1, ['p', 'r', 'x'], 2)
    assert head.latest == ['p', 'r']
    with pytest.raises(ValueError, match='without a line'):
        RunHead(incarnation=1).base()


def test_a_view_reads_its_line_first_then_down_its_bases() -> None:
    bases = {'c': LineBase('b', 4, 7), 'b': LineBase('a', 2, 3), 'a': None}
    assert view_segments('c', 6, 2, bases.__getitem__) == [
        ViewSegment('c', 6, 2),
        ViewSegment('b', 4, 7),
        ViewSegment('a', 2, 3),
    ]
    # A base never serves more than the view above it may show.
    assert view_segments('c', 3, 2, bases.__getitem__)[1:] == [ViewSegment('b', 3, 7), ViewSegment('a', 2, 3)]
    looped = {'x': LineBase('y', 1, 1), 'y': LineBase('x', 1, 1)}
    with pytest.raises(ValueError, match='cycle'):
        view_segments('x', 1, 1, looped.__getitem__)


def test_assembling_takes_the_first_segment_holding_each_position() -> None:
    assert assemble(4, [{2: 'own-2', 3: 'own-3'}, {1: 'base-1', 2: 'base-2'}, {0: 'root-0'}]) == [
        'root-0',
        'base-1',
        'own-2',
        'own-3',
    ]
    with pytest.raises(ValueError, match='position 1 of 3'):
        assemble(3, [{0: 'a', 2: 'c'}])


def test_apply_with_through_accepts_gaps_of_deleted_rows() -> None:
    head = RunHead(incarnation=1)
    head.apply([(1, 0, 'a'), (4, 1, 'b')], through=6)
    assert (head.last_no, head.latest) == (6, ['a', 'b'])
    head.apply([(3, 0, 'stale')], through=6)  # already known: ignored
    assert head.latest == ['a', 'b']


def test_apply_without_through_stops_at_the_first_missing_number() -> None:
    head = RunHead(incarnation=None)
    head.apply([(1, 0, 'a'), (2, None, None), (4, 1, 'b')])
    assert (head.last_no, head.latest) == (2, ['a'])
    head.apply([(3, 2, None), (4, 1, 'b')])
    assert (head.last_no, head.latest) == (4, ['a', 'b', None])


def test_a_copy_advances_independently() -> None:
    head = RunHead(incarnation='x', last_no=1, latest=['a'])
    copy = head.copy()
    copy.apply([(2, 1, 'b')])
    assert (head.last_no, head.latest) == (1, ['a'])
    assert (copy.incarnation, copy.last_no, copy.latest) == ('x', 2, ['a', 'b'])


def test_a_row_claiming_a_position_it_cannot_hold_is_skipped_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    head = RunHead(incarnation=1)
    with caplog.at_level(logging.WARNING, logger='step_persistence'):
        head.apply([(1, 0, 'a'), (2, 1_000_000_000, 'huge'), (3, 1, 'b')])
    assert (head.last_no, head.latest) == (3, ['a', 'b'])
    assert 'claims history position 1000000000' in caplog.text
    assert [plausible_position(no, position) for no, position in [(1, 0), (1, 1), (5, 4), (5, -1)]] == [
        True,
        False,
        True,
        False,
    ]
    assert plausible_position(1, 2, base_length=2) and not plausible_position(1, 3, base_length=2)
