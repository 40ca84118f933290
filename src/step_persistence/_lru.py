"""A bounded map that forgets its least recently used entries: what every per-run cache is built on."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Generic, TypeVar

__all__ = ['BoundedLru']

K = TypeVar('K')
V = TypeVar('V')


class BoundedLru(Generic[K, V]):
    """At most `capacity` entries; reading or writing an entry makes it the most recently used."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f'a cache holds at least one entry, got capacity={capacity!r}')
        self._entries: OrderedDict[K, V] = OrderedDict()
        self._capacity = capacity

    def __contains__(self, key: K) -> bool:
        """Whether `key` is held (marks it used)."""
        if key not in self._entries:
            return False
        self._entries.move_to_end(key)
        return True

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: K) -> V | None:
        """The value held for `key` (marked used), or `None`."""
        value = self._entries.get(key)
        if key in self._entries:
            self._entries.move_to_end(key)
        return value

    def get_or_build(self, key: K, build: Callable[[], V]) -> V:
        """The value held for `key`, or `build()` held from now on."""
        if key in self._entries:
            self._entries.move_to_end(key)
            return self._entries[key]
        value = build()
        self.put(key, value)
        return value

    def put(self, key: K, value: V) -> None:
        """Hold `value` for `key`, forgetting the least recently used entries beyond the capacity."""
        self._entries[key] = value
        self._entries.move_to_end(key)
        while len(self._entries) > self._capacity:
            self._entries.popitem(last=False)

    def pop(self, key: K) -> V | None:
        """Forget `key`; its value, or `None`."""
        return self._entries.pop(key, None)

    def clear(self) -> None:
        self._entries.clear()
