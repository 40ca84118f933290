"""`HarnessMongoStore`: the collections pydantic-ai-harness's `MongoStepStore` wrote, read (`harness+mongodb://`).

Its collections, as it creates them: `runs` (`_id` the run id), `events` and `snapshots` (each
numbered per run by `seq`), `tool_effects` (one document per call), `snapshot_messages` (`_id`
a message's SHA-256, `message` its JSON), `snapshot_idempotency_keys`, `counters`, and the
blobs of its default media store: a manifest per blob in `media` and its chunks in
`media_chunks` (`files_id` the digest, `n` the chunk number). A snapshot's `messages` is JSON
text naming its messages (`{"message_refs": [...]}`) or, from older releases, the messages
themselves. Only `find` is ever sent.

Needs the `mongodb` extra (pymongo).
"""

from __future__ import annotations

from typing import Any

from step_persistence._urls import redact_url
from step_persistence.media.protocol import MediaStore
from step_persistence.media.uri import parse_media_uri
from step_persistence.stores.harness._base import HarnessStore, Stored, StoredSnapshot
from step_persistence.stores.harness._messages import MessagesColumn

__all__ = ['HarnessMongoStore']


class HarnessMongoStore(HarnessStore):
    """The harness's collections in `database` on the MongoDB server at `db_url` (the store's own client,
    closed by `aclose()`), or on a caller's pymongo `AsyncMongoClient` as `client` (never closed)."""

    def __init__(
        self,
        *,
        database: str,
        db_url: str | None = None,
        client: Any = None,
        media_store: MediaStore | None = None,
    ) -> None:
        super().__init__(media_store=media_store)
        if (db_url is None) == (client is None):
            raise ValueError('give the harness MongoDB store exactly one of db_url= and client=')
        self._db_url = db_url
        self._client = client
        self._owns_client = client is None
        self._database = database

    @property
    def description(self) -> str:
        where = redact_url(self._db_url) if self._db_url is not None else 'a caller-provided client'
        return f'the harness MongoDB database {self._database!r} at {where}'

    def _db(self) -> Any:
        if self._client is None:
            from pymongo import AsyncMongoClient

            self._client = AsyncMongoClient(self._db_url)
        return self._client[self._database]

    async def _find(self, collection: str, query: dict[str, Any], sort: str | None = None) -> list[Stored]:
        cursor = self._db()[collection].find(query)
        if sort is not None:
            cursor = cursor.sort(sort, 1)
        return [document async for document in cursor]

    async def _read_runs(self) -> list[Stored]:
        return await self._find('runs', {})

    async def _read_events(self, run_id: str) -> list[Stored]:
        return await self._find('events', {'run_id': run_id}, sort='seq')

    async def _read_effects(self, run_id: str) -> list[Stored]:
        return await self._find('tool_effects', {'run_id': run_id})

    async def _read_snapshots(self, run_id: str) -> list[StoredSnapshot]:
        documents = await self._find('snapshots', {'run_id': run_id}, sort='seq')
        columns = [MessagesColumn.parse(document.get('messages')) for document in documents]
        digests = sorted({digest for column in columns for digest in column.refs or ()})
        found = await self._find('snapshot_messages', {'_id': {'$in': digests}}) if digests else []
        stored = {document['_id']: document.get('message') for document in found}
        return [
            StoredSnapshot(document, column.resolve(stored))
            for document, column in zip(documents, columns, strict=True)
        ]

    async def _read_blob(self, uri: str) -> bytes:
        digest = parse_media_uri(uri)
        chunks = await self._find('media_chunks', {'files_id': digest}, sort='n')
        if not chunks:
            raise LookupError(f'blob {uri} is not in collection media_chunks')
        return b''.join(bytes(chunk['data']) for chunk in chunks)

    async def aclose(self) -> None:
        if self._owns_client and self._client is not None:
            client, self._client = self._client, None
            await client.close()
