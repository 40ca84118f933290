"""The `messages` collection: each distinct message of a run stored once, under a per-run number.

A message document is `{run_id, no, digest, body, externalized}`: `digest` is the SHA-256 of the
message's JSON (unique per run), `body` the JSON text as persisted: the message's own JSON, or,
when `externalized`, that JSON with its large parts moved to the media store. Snapshots refer to
messages by number, so saving a snapshot of a history that grew by two messages writes two
message documents.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from pymongo.errors import BulkWriteError

from step_persistence._history import EncodedMessage, pack_refs
from step_persistence.stores._media import MessageMedia
from step_persistence.stores.mongo._client import Database
from step_persistence.stores.mongo._limits import check_document_size

__all__ = ['LoadedMessages', 'MessageStore', 'PreparedMessage']

_IN_CHUNK: Final = 1000
"""Largest number of values in one `$in` (or `$or`) list."""

_WIDEST_NUMBER: Final = 2**62
"""A message number as wide as any real one in BSON, for measuring a document before numbering it."""

_TOO_LARGE_HINT: Final = (
    ': payloads at or above media_threshold_bytes go to the media store, so this message holds '
    'too much below that threshold (lower it) or the store has no media store'
)


@dataclass(frozen=True)
class PreparedMessage:
    """A new message as it will be stored, checked against the document size limit."""

    digest: str
    body: str
    externalized: bool


@dataclass
class LoadedMessages:
    """Message trees by number, and the messages that could not be read, by number."""

    trees: dict[int, Any] = field(default_factory=dict[int, Any])
    errors: dict[int, Exception] = field(default_factory=dict[int, Exception])

    def tree(self, number: int) -> Any:
        """The tree of message `number`; raises why it is unreadable, or `KeyError` if it is missing."""
        if number in self.errors:
            raise self.errors[number]
        if number not in self.trees:
            raise KeyError(f'message {number} is missing')
        return self.trees[number]


class MessageStore:
    """Writes and reads one database's `messages` collection through a media policy."""

    def __init__(self, database: Database, media: MessageMedia) -> None:
        self._collection = database['messages']
        self._media = media

    async def numbers(self, run_id: str, digests: Sequence[str]) -> dict[str, int]:
        """The numbers of those of `digests` that the run has stored."""
        found: dict[str, int] = {}
        for start in range(0, len(digests), _IN_CHUNK):
            query = {'run_id': run_id, 'digest': {'$in': list(digests[start : start + _IN_CHUNK])}}
            async for document in self._collection.find(query, {'digest': 1, 'no': 1}):
                found[document['digest']] = document['no']
        return found

    async def prepare(self, run_id: str, fresh: Sequence[EncodedMessage]) -> list[PreparedMessage]:
        """Move large parts of new messages to the media store; `ValueError` if one would still exceed 16 MiB."""
        prepared: list[PreparedMessage] = []
        for message in fresh:
            packed = await self._media.pack_message(message)
            item = PreparedMessage(
                digest=message.digest, body=packed.data.decode('utf-8'), externalized=packed.externalized
            )
            check_document_size(
                self._document(run_id, item, _WIDEST_NUMBER),
                what=f'message {message.digest[:12]}',
                run_id=run_id,
                hint=_TOO_LARGE_HINT,
            )
            prepared.append(item)
        return prepared

    @staticmethod
    def _document(run_id: str, message: PreparedMessage, number: int) -> dict[str, Any]:
        return {
            'run_id': run_id,
            'no': number,
            'digest': message.digest,
            'body': message.body,
            'externalized': message.externalized,
        }

    async def insert(self, run_id: str, prepared: Sequence[PreparedMessage], *, first_no: int) -> dict[str, int]:
        """Store new messages numbered from `first_no`; return every one's number.

        A message another writer stored meanwhile keeps that writer's number.
        """
        if not prepared:
            return {}
        documents = [self._document(run_id, message, first_no + offset) for offset, message in enumerate(prepared)]
        numbers = {document['digest']: document['no'] for document in documents}
        try:
            await self._collection.insert_many(documents, ordered=False)
        except BulkWriteError as error:
            failures = error.details.get('writeErrors', [])
            if error.details.get('writeConcernErrors') or any(failure.get('code') != 11000 for failure in failures):
                raise
            taken = [documents[failure['index']]['digest'] for failure in failures]
            stored = await self.numbers(run_id, taken)
            if len(stored) != len(taken):
                raise RuntimeError(f'message numbers of run {run_id!r} collided: {error.details}') from error
            numbers.update(stored)
        return numbers

    async def load(self, run_id: str, numbers: Collection[int]) -> LoadedMessages:
        """Read the messages with these numbers, restoring their media; failures are kept per message."""
        loaded = LoadedMessages()
        ranges = pack_refs(sorted(numbers))
        for start in range(0, len(ranges), _IN_CHUNK):
            spans = [{'no': {'$gte': first, '$lte': last}} for first, last in ranges[start : start + _IN_CHUNK]]
            async for document in self._collection.find({'run_id': run_id, '$or': spans}):
                number = document.get('no')
                if not isinstance(number, int):
                    continue
                try:
                    loaded.trees[number] = await self._tree(document)
                except Exception as error:
                    loaded.errors[number] = error
        return loaded

    async def _tree(self, document: dict[str, Any]) -> Any:
        body, externalized = document.get('body'), document.get('externalized')
        if not isinstance(body, str) or not isinstance(externalized, bool):
            raise ValueError(f'message {document.get("no")!r} has a malformed body or externalized flag')
        return await self._media.unpack_message(body, externalized=externalized)

    async def delete_run(self, run_id: str) -> None:
        await self._collection.delete_many({'run_id': run_id})
