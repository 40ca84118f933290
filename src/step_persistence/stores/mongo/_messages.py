"""The `messages` collection: one document per stored version of a history position, numbered per line.

A message document is `{line, no, run_id, position, digest, body, externalized}`: number `no`
(per line, 1, 2, 3, ...) of line `line` holds a version of the message at `position` of the
histories viewed on that line; `run_id` is the run whose save wrote it (for people reading the
database: nothing reads it). `digest` is the SHA-256 of the message's JSON, `body` the JSON text as
persisted: the message's own JSON, or, when `externalized`, that JSON with its large parts moved
to the media store. Documents written before lines existed have no `line`: they are numbered per
run, and read as the run's legacy line (`_lines.py`).

A snapshot's history is a view `(line, length, through)` read through its segments (the line,
then its bases, `stores/_positions.view_segments`): one aggregation per segment finds the newest
document per position numbered at most the segment's `through`, and `assemble` takes each
position from the first segment that has it. A reclaimed version keeps its number as a
*tombstone* `{line, no, run_id, reclaimed: true}` (see `_reclaiming.py`), so numbers stay claimed.

An `externalized` document also carries `stored_digest`, the SHA-256 of its `body` as written.
Reading re-hashes every body against `digest` (inline) or `stored_digest` (externalized; each
payload is then checked against its content address by the media store), and an assembled history
against its snapshot's `history_digest`, so a message altered in the database, even by one
character, makes the snapshots that use it unreadable instead of being returned. (Externalized
documents written before `stored_digest` existed are read unchecked.)
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Final

from pymongo.errors import BulkWriteError

from step_persistence._history import EncodedMessage, decode_messages, history_digest
from step_persistence.stores._media import MessageMedia, PackedMessage
from step_persistence.stores._positions import ViewSegment, assemble
from step_persistence.stores.mongo._client import Database, aggregate_all
from step_persistence.stores.mongo._documents import StoredView
from step_persistence.stores.mongo._indexes import LINE_NUMBER_INDEX, is_duplicate_on
from step_persistence.stores.mongo._limits import WIDEST_NUMBER, check_document_size
from step_persistence.stores.mongo._lines import LineBases, line_key, line_messages

if TYPE_CHECKING:
    from pydantic_ai.messages import ModelMessage

__all__ = ['MessageStore', 'message_document']

_TOO_LARGE_HINT: Final = (
    ': payloads at or above media_threshold_bytes go to the media store, so this message holds '
    'too much below that threshold (lower it) or the store has no media store'
)


_WIDEST_LINE: Final = 'f' * 24
"""A line id as long as any this store writes on a message, for measuring a document before its line is known."""

_READ: Final = {'no': 1, 'digest': 1, 'stored_digest': 1, 'body': 1, 'externalized': 1}
"""What reading a version needs: its number, and what checking and decoding its body needs."""


def message_document(
    line: str, run_id: str, *, no: int, position: int, digest: str, packed: PackedMessage
) -> dict[str, Any]:
    """The document storing `packed` (a message whose digest is `digest`) as number `no` of `line` at `position`."""
    document = {
        'line': line,
        'no': no,
        'run_id': run_id,
        'position': position,
        'digest': digest,
        'body': packed.data.decode('utf-8'),
        'externalized': packed.externalized,
    }
    if packed.externalized:
        document['stored_digest'] = hashlib.sha256(packed.data).hexdigest()
    return document


def _sha256(body: str) -> str:
    try:
        return hashlib.sha256(body.encode('utf-8')).hexdigest()
    except UnicodeEncodeError:  # a lone surrogate: no body this store writes holds one
        return ''


def _intact(document: dict[str, Any]) -> bool:
    """Whether a message document's body is a string that hashes to its digest (`stored_digest` if externalized)."""
    body, externalized = document.get('body'), document.get('externalized')
    if not isinstance(body, str) or not isinstance(externalized, bool):
        return False
    expected = document.get('stored_digest') if externalized else document.get('digest')
    if externalized and expected is None:
        return True  # written before `stored_digest` existed: cannot be checked
    return isinstance(expected, str) and _sha256(body) == expected


def _position(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


class MessageStore:
    """Writes and reads one database's `messages` collection through a media policy."""

    def __init__(self, database: Database, media: MessageMedia, bases: LineBases) -> None:
        self._collection = database['messages']
        self._media = media
        self._bases = bases

    async def pack(self, run_id: str, message: EncodedMessage) -> PackedMessage:
        """The message as it will be stored (payloads moved to the media store); `ValueError` if over 16 MiB."""
        packed = await self._media.pack_message(message)
        check_document_size(
            message_document(
                _WIDEST_LINE, run_id, no=WIDEST_NUMBER, position=WIDEST_NUMBER, digest=message.digest, packed=packed
            ),
            what=f'message {message.digest[:12]}',
            run_id=run_id,
            hint=_TOO_LARGE_HINT,
        )
        return packed

    async def insert(self, documents: Sequence[dict[str, Any]]) -> int:
        """Insert `documents` (numbered consecutively on one line) in order; return how many were inserted.

        Fewer than all means that the next number was already taken on the line (the unique
        `(line, no)` index): the documents from there on were not inserted. Any other failure is
        raised.
        """
        if not documents:
            return 0
        try:
            await self._collection.insert_many(list(documents), ordered=True)
        except BulkWriteError as error:
            failures = error.details.get('writeErrors', [])
            if error.details.get('writeConcernErrors') or not failures:
                raise
            if not is_duplicate_on(failures[0], LINE_NUMBER_INDEX, ('line', 'no')):
                raise
            return int(failures[0]['index'])
        return len(documents)

    async def history(self, view: StoredView) -> list[ModelMessage]:
        """The messages of a snapshot's view, read with one aggregation per segment.

        Raises `ValueError` when a position has no document (damaged or removed documents), a
        body does not match its digest or is not a message, the history does not match the
        snapshot's `history_digest`, or the view's segments cannot hold its length; and whatever
        the media store raises for a missing or corrupt blob. Only the documents found are held,
        so a damaged length allocates nothing.
        """
        if view.length == 0 or view.line is None:
            if view.length:
                raise ValueError(f'a history of {view.length} messages on no line')
            return []
        segments = await self._bases.segments(view.line, view.length, view.through)
        if view.length > sum(segment.through for segment in segments):
            raise ValueError(f'a history of {view.length} messages cannot end at message number {view.through}')
        found = [await self._newest(segment, view.length) for segment in segments]
        documents = assemble(view.length, found)
        for document in documents:
            if not _intact(document):
                raise ValueError(
                    f'message {document.get("no")!r} is malformed or does not match its digest (a damaged or '
                    'edited document); the snapshots that use it are unreadable'
                )
        if view.history_digest is not None and view.history_digest != history_digest(
            document['digest'] for document in documents
        ):
            raise ValueError('the stored messages do not make up the history the snapshot recorded (damaged documents)')
        trees = [
            await self._media.unpack_message(document['body'], externalized=document['externalized'])
            for document in documents
        ]
        return decode_messages(trees)

    async def digests(self, view: StoredView, length: int) -> list[str | None]:
        """The digest of each of the first `length` messages of a view (at most its length), for a head.

        A position without an intact document is `None` (the next save writes it again), so a
        damaged view still gives a head; `ValueError` only for damaged line bases.
        """
        length = min(length, view.length)
        if length == 0 or view.line is None:
            return []
        segments = await self._bases.segments(view.line, length, view.through)
        found = [await self._newest(segment, length) for segment in segments]
        digests: list[str | None] = []
        for position in range(length):
            document = next((rows[position] for rows in found if position in rows), None)
            digest = None if document is None or not _intact(document) else document.get('digest')
            digests.append(digest if isinstance(digest, str) else None)
        return digests

    async def _newest(self, segment: ViewSegment, length: int) -> dict[int, dict[str, Any]]:
        """Per position below `length` (and the segment's), the newest document numbered at most its `through`."""
        if segment.length == 0 or segment.through == 0:
            return {}
        line = str(segment.line)
        found = await aggregate_all(
            self._collection,
            [
                {'$match': {**line_key(line), 'position': {'$gte': 0, '$lt': min(length, segment.length)}}},
                {'$match': {**line_messages(line), 'no': {'$lte': segment.through}}},
                {'$sort': {'position': 1, 'no': -1}},
                {'$group': {'_id': '$position', **{name: {'$first': f'${name}'} for name in _READ}}},
            ],
        )
        return {position: document for document in found if (position := _position(document['_id'])) is not None}
