"""What a store knows of each run's stored messages: the digest of the newest row per history position.

A save compares the snapshot's digests with this head to find the positions to write (first
before its write transaction, to pack the messages that will be new, then inside it). The cache
only ever holds heads of committed rows, in number order; every write transaction checks the
head it starts from against the run's row (`runs.id`, `runs.last_message_no`), so a stale head
(another process or task wrote, or the run was deleted and registered again) is caught up
before it is used.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field

__all__ = ['HeadCache', 'MessageRow', 'RunHead']

MessageRow = tuple[int, int, str]
"""`(no, position, digest)` of one `messages` row."""


@dataclass
class RunHead:
    """The newest stored digest at each position of one run's history, as of message number `last_no`."""

    run_pk: int
    """`runs.id` of the run these rows belong to (never reused, so a re-registered run gets a new head)."""
    last_no: int = 0
    latest: list[str | None] = field(default_factory=list[str | None])
    """Per history position, the digest of its newest row (`None` for a position with no row)."""

    def apply(self, rows: Iterable[MessageRow], *, through: int) -> None:
        """Add committed rows, in number order, and record that every row up to `through` is known.

        Rows numbered at or below `last_no` are already in the head and are ignored, so applying
        the same rows twice (two tasks catching up at once) changes nothing.
        """
        for no, position, digest in rows:
            if no <= self.last_no:
                continue
            if position >= len(self.latest):
                self.latest.extend([None] * (position + 1 - len(self.latest)))
            self.latest[position] = digest
            self.last_no = no
        self.last_no = max(self.last_no, through)

    def copy(self) -> RunHead:
        """An independent copy, to advance without changing this head."""
        return RunHead(run_pk=self.run_pk, last_no=self.last_no, latest=list(self.latest))


class HeadCache:
    """A bounded, least-recently-used map of run id -> `RunHead`."""

    def __init__(self, max_runs: int = 256) -> None:
        self._runs: OrderedDict[str, RunHead] = OrderedDict()
        self._max_runs = max_runs

    def get(self, run_id: str) -> RunHead | None:
        head = self._runs.get(run_id)
        if head is not None:
            self._runs.move_to_end(run_id)
        return head

    def remember(self, run_id: str, head: RunHead) -> None:
        """Keep `head` for the run, unless the cache holds a newer head of the same run."""
        known = self._runs.get(run_id)
        if known is None or known.run_pk != head.run_pk or known.last_no <= head.last_no:
            self._runs[run_id] = head
        self._runs.move_to_end(run_id)
        while len(self._runs) > self._max_runs:
            self._runs.popitem(last=False)

    def forget(self, run_id: str) -> None:
        self._runs.pop(run_id, None)
