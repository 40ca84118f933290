"""The position model shared by every durable store: heads, planned saves, changed positions."""

from __future__ import annotations

import logging

import pytest

from step_persistence.stores._positions import NumberedRow, RunHead, changed_positions, plan_saves, plausible_position


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
    head.advance(plan.rows, through=plan.throughs[-1])
    assert (head.last_no, head.latest) == (3, ['p', 'r', 'q'])
    assert plan_saves(head, histories[-1:]).rows == []


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
