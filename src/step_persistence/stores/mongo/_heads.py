"""The head a run's next save builds on (`stores/_positions.RunHead`), from where the design says, in order.

1. The store's cache of the run (`KnownRuns`): the view its last save through this store wrote.
2. The view of the run's newest snapshot (of any state).
3. The view of its origin snapshot (`RunRecord.origin`), if that snapshot is still stored: how the
   next run of a conversation shares its line. When the first history the save writes starts with
   exactly that history (its `history_digest` matches the snapshot's), the head's digests are that
   history's own and no message is read: the common turn of a chat costs one snapshot lookup.
4. Else no line: the first save starts one.

Otherwise the view's digests are read through its segments (`MessageStore.digests`), bodies
checked, so a damaged message is written again rather than reused. A head is cut to the length of
the first history being saved (a prefix of a view is a view, and a save never needs more), so a
damaged length allocates nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from pymongo import DESCENDING

from step_persistence._history import history_digest
from step_persistence._reading import logger
from step_persistence.records import RunOrigin
from step_persistence.stores._positions import RunHead
from step_persistence.stores.mongo._client import Database
from step_persistence.stores.mongo._documents import StoredView, stored_view
from step_persistence.stores.mongo._known_runs import KnownRuns, Registered
from step_persistence.stores.mongo._messages import MessageStore

__all__ = ['RunHeads']

_NEWEST_PAGE: Final = 4
"""How many of a run's newest snapshot documents a head looks at for one whose view is readable."""

_VIEW_FIELDS: Final = {'_id': 0, 'run_id': 1, 'line': 1, 'history_length': 1, 'through_message': 1, 'history_digest': 1}


def _view(document: dict[str, Any]) -> StoredView | None:
    """The view of a snapshot document; `None` for a pruned one's tombstone or a damaged one (logged)."""
    if 'history_length' not in document:
        return None
    try:
        return stored_view(document)
    except ValueError as error:
        logger.warning('not building on the damaged view of a snapshot of run %r: %r', document.get('run_id'), error)
        return None


def _registration(document: dict[str, Any]) -> int | None:
    value = document.get('registration')
    return value if isinstance(value, int) and not isinstance(value, bool) else None


class RunHeads:
    """Finds the head of a run's next save (see the module docstring)."""

    def __init__(self, database: Database, messages: MessageStore, known_runs: KnownRuns) -> None:
        self._runs = database['runs']
        self._snapshots = database['snapshots']
        self._messages = messages
        self._known_runs = known_runs

    async def head(self, run_id: str, first: Sequence[str]) -> RunHead:
        """The head of the run's next save; `first`: the digests of the first history it saves.

        Raises nothing for a run that is not registered: its head is empty (the write says so).
        """
        known = self._known_runs.head(run_id)
        if isinstance(known, RunHead):
            return known.copy()
        if isinstance(known, Registered):
            return await self._from_origin(known.registration, known.origin, first)
        return await self.read(run_id, first)

    async def read(self, run_id: str, first: Sequence[str]) -> RunHead:
        """The head as the database has it (no cache): newest snapshot, else origin, else none."""
        run = await self._runs.find_one({'_id': run_id}, {'registration': 1, 'origin': 1})
        if run is None:
            return RunHead(incarnation=None)
        registration = _registration(run)
        cursor = self._snapshots.find({'run_id': run_id}, _VIEW_FIELDS).sort('seq', DESCENDING).limit(_NEWEST_PAGE)
        for document in await cursor.to_list(None):
            view = _view(document)
            if view is not None:
                return await self._from_view(registration, view, first)
        try:
            origin = RunOrigin.model_validate(run['origin'], strict=True) if 'origin' in run else None
        except ValueError:
            origin = None  # the run's record is unreadable anyway
        return await self._from_origin(registration, origin, first)

    async def _from_origin(self, registration: int | None, origin: RunOrigin | None, first: Sequence[str]) -> RunHead:
        if origin is None:
            return RunHead(incarnation=registration)
        document = await self._snapshots.find_one({'run_id': origin.run_id, 'seq': origin.seq}, _VIEW_FIELDS)
        view = None if document is None else _view(document)
        if view is None:
            return RunHead(incarnation=registration)
        if (
            view.history_digest is not None
            and len(first) >= view.length
            and history_digest(first[: view.length]) == view.history_digest
        ):
            return RunHead(
                incarnation=registration, line=view.line, last_no=view.through, latest=list(first[: view.length])
            )
        return await self._from_view(registration, view, first)

    async def _from_view(self, registration: int | None, view: StoredView, first: Sequence[str]) -> RunHead:
        if view.line is None:
            return RunHead(incarnation=registration)
        try:
            latest = await self._messages.digests(view, len(first))
        except ValueError as error:
            logger.warning('not building on a view with damaged line bases: %r', error)
            return RunHead(incarnation=registration)
        return RunHead(incarnation=registration, line=view.line, last_no=view.through, latest=latest)
