"""The `messages` collection: one document per stored version of each position of a run's history.

A message document is `{run_id, no, position, digest, body, externalized}`: number `no` (per run,
1, 2, 3, ...) holds a version of the message at `position` of the run's history. `digest` is the
SHA-256 of the message's JSON, `body` the JSON text as persisted: the message's own JSON, or,
when `externalized`, that JSON with its large parts moved to the media store. A snapshot names
its history with `history_length` and `through_message`: message `i` is the document at position
`i` with the largest number not above `through_message` (see `_histories.py` for writing).

An `externalized` document also carries `stored_digest`, the SHA-256 of its `body` as written.
Reading re-hashes every body against `digest` (inline) or `stored_digest` (externalized; each
payload is then checked against its content address by the media store), so a message altered in
the database, even by one character, makes the snapshots that use it unreadable instead of being
returned. (Externalized documents written before `stored_digest` existed are read unchecked.)
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any, Final

from pydantic_ai.messages import ModelMessage
from pymongo import ASCENDING
from pymongo.errors import BulkWriteError

from step_persistence._history import EncodedMessage, decode_messages
from step_persistence.stores._media import MessageMedia, PackedMessage
from step_persistence.stores._positions import RunHead
from step_persistence.stores.mongo._client import Database, aggregate_all
from step_persistence.stores.mongo._indexes import MESSAGE_NUMBER_INDEX, is_duplicate_on
from step_persistence.stores.mongo._limits import WIDEST_NUMBER, check_document_size

__all__ = ['MessageStore', 'message_document']

_TOO_LARGE_HINT: Final = (
    ': payloads at or above media_threshold_bytes go to the media store, so this message holds '
    'too much below that threshold (lower it) or the store has no media store'
)


def message_document(run_id: str, *, no: int, position: int, digest: str, packed: PackedMessage) -> dict[str, Any]:
    """The document storing `packed` (a message whose digest is `digest`) as number `no` at `position`."""
    document = {
        'run_id': run_id,
        'no': no,
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


def _integer(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _string(value: Any) -> str | None:
    return value if isinstance(value, str) else None


class MessageStore:
    """Writes and reads one database's `messages` collection through a media policy."""

    def __init__(self, database: Database, media: MessageMedia) -> None:
        self._collection = database['messages']
        self._media = media

    async def pack(self, run_id: str, message: EncodedMessage) -> PackedMessage:
        """The message as it will be stored (payloads moved to the media store); `ValueError` if over 16 MiB."""
        packed = await self._media.pack_message(message)
        check_document_size(
            message_document(run_id, no=WIDEST_NUMBER, position=WIDEST_NUMBER, digest=message.digest, packed=packed),
            what=f'message {message.digest[:12]}',
            run_id=run_id,
            hint=_TOO_LARGE_HINT,
        )
        return packed

    async def catch_up(self, run_id: str, head: RunHead) -> None:
        """Add to `head` the run's documents numbered above `head.last_no`.

        A document whose body does not match its digest counts as one without a digest, so the
        next save writes its position again instead of pointing a new snapshot at the damaged
        body. (A store's own writes advance its head without this read: it happens when a store
        object first writes to a run it did not register, or after another writer took numbers.)
        """
        cursor = self._collection.find(
            {'run_id': run_id, 'no': {'$gt': head.last_no}},
            {'_id': 0, 'no': 1, 'position': 1, 'digest': 1, 'stored_digest': 1, 'body': 1, 'externalized': 1},
        ).sort('no', ASCENDING)
        rows = [
            (number, _integer(document.get('position')), _string(document.get('digest')) if _intact(document) else None)
            async for document in cursor
            if (number := _integer(document.get('no'))) is not None
        ]
        head.apply(rows)

    async def insert(self, documents: Sequence[dict[str, Any]]) -> int:
        """Insert `documents` (numbered consecutively) in order; return how many were inserted.

        Fewer than all means that the next number was already taken by another writer: the
        documents from there on were not inserted. Any other failure is raised.
        """
        if not documents:
            return 0
        try:
            await self._collection.insert_many(list(documents), ordered=True)
        except BulkWriteError as error:
            failures = error.details.get('writeErrors', [])
            if error.details.get('writeConcernErrors') or not failures:
                raise
            if not is_duplicate_on(failures[0], MESSAGE_NUMBER_INDEX, ('run_id', 'no')):
                raise
            return int(failures[0]['index'])
        return len(documents)

    async def history(self, run_id: str, *, length: int, through: int) -> list[ModelMessage]:
        """The `length` messages of a history as of message number `through`, read with one aggregation.

        Raises `ValueError` when a position has no document (damaged or removed documents), a
        body does not match its digest or is not a message, and whatever the media store raises
        for a missing or corrupt blob. `length` is at most `through` (see `snapshot_from_document`),
        and only the documents found are held, so a damaged length allocates nothing.
        """
        if length == 0:
            return []
        if length > through:
            raise ValueError(f'a history of {length} messages cannot end at message number {through}')
        found = await aggregate_all(
            self._collection,
            [
                {'$match': {'run_id': run_id, 'position': {'$gte': 0, '$lt': length}, 'no': {'$lte': through}}},
                {'$sort': {'position': 1, 'no': -1}},
                {
                    '$group': {
                        '_id': '$position',
                        'no': {'$first': '$no'},
                        'digest': {'$first': '$digest'},
                        'stored_digest': {'$first': '$stored_digest'},
                        'body': {'$first': '$body'},
                        'externalized': {'$first': '$externalized'},
                    }
                },
                {'$sort': {'_id': 1}},
            ],
        )
        for expected, document in enumerate(found):
            if document['_id'] != expected:
                raise ValueError(f'no stored message at position {expected} up to number {through}')
        if len(found) != length:
            raise ValueError(f'no stored message at position {len(found)} up to number {through}')
        return decode_messages([await self._tree(document) for document in found])

    async def _tree(self, document: dict[str, Any]) -> Any:
        if not _intact(document):
            raise ValueError(
                f'message {document.get("no")!r} is malformed or does not match its digest (a damaged or edited '
                'document); the snapshots that use it are unreadable'
            )
        return await self._media.unpack_message(document['body'], externalized=document['externalized'])

    async def delete_run(self, run_id: str) -> None:
        await self._collection.delete_many({'run_id': run_id})
