"""`BoundedLru`: the bounded map behind every per-run cache."""

from __future__ import annotations

import pytest

from step_persistence._lru import BoundedLru


def test_forgets_the_least_recently_used_entry_beyond_its_capacity() -> None:
    cache: BoundedLru[str, int] = BoundedLru(2)
    cache.put('a', 1)
    cache.put('b', 2)
    assert cache.get('a') == 1  # 'a' is now the most recently used
    cache.put('c', 3)
    assert 'b' not in cache
    assert (cache.get('a'), cache.get('c'), len(cache)) == (1, 3, 2)


def test_membership_and_get_or_build_count_as_use() -> None:
    cache: BoundedLru[str, int] = BoundedLru(2)
    cache.put('a', 1)
    cache.put('b', 2)
    assert 'a' in cache
    built: list[str] = []
    assert cache.get_or_build('a', lambda: built.append('a') or 9) == 1
    assert cache.get_or_build('c', lambda: built.append('c') or 3) == 3
    assert built == ['c']
    assert 'b' not in cache and 'a' in cache


def test_pop_clear_and_a_none_value() -> None:
    cache: BoundedLru[str, int | None] = BoundedLru(4)
    cache.put('known', None)
    assert 'known' in cache and cache.get('known') is None
    cache.put('x', 5)
    assert cache.pop('x') == 5 and cache.pop('x') is None
    cache.clear()
    assert len(cache) == 0


def test_a_capacity_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match='at least one'):
        BoundedLru[str, int](0)
