"""`MongoMediaStore`: blobs in MongoDB as a manifest document plus content-addressed chunks.

`<collection>` holds one manifest per blob: `_id` (the key; by default the blob's SHA-256),
`digest`, `size`, `files_id`, `chunk_size`, `chunks` (count), `media_type`, `filename` and
`metadata` (a JSON object as text, so any key round-trips). `<collection>_chunks` holds the bytes
in documents `{files_id, n, data}` with a unique index on `(files_id, n)`, so a blob larger than
MongoDB's 16 MiB document limit stores fine. `files_id` is `<sha256>/<chunk_size>/<token>`: each
put writes chunks of its own (older versions wrote `<sha256>/<chunk_size>`, shared by puts of the
same bytes), so deleting a blob never takes the chunks of another put of the same bytes. Chunks
are written before the manifest: a reader never sees a manifest without all its chunks. A manifest
also has `touched_at`, when it was last put again or reused (missing on older manifests: they
count as touched long ago).

A blob is never trusted blindly when it is reused: `touch` (what the step stores call before they
rely on a stored blob) reads its chunks back and checks them against the digest, answering
`False` (logged) for a damaged blob, and `put` of bytes whose stored blob is damaged writes fresh
chunks and points the manifest at them. A flipped byte in a chunk therefore makes the snapshots
that used the blob unreadable, but never the next save of the same payload.
"""

from __future__ import annotations

import hashlib
import json
import secrets
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

from pymongo.asynchronous.collection import AsyncCollection

from step_persistence._arguments import require_text
from step_persistence._closing import ClosesOnExit
from step_persistence._reading import logger
from step_persistence.media.clock import media_now
from step_persistence.media.keys import blob_key, resolve_public_url, uri_of_key
from step_persistence.media.protocol import NO_CONTEXT, KeyStrategy, MediaContext, PublicUrlResolver, StoredBlob
from step_persistence.media.uri import check_digest, media_uri_for, parse_media_uri
from step_persistence.stores.mongo._client import MongoClientLike, MongoConnection, insert_new
from step_persistence.stores.mongo._indexes import IndexSetup, chunk_indexes
from step_persistence.stores.mongo._loops import PerLoop

__all__ = ['DEFAULT_CHUNK_SIZE_BYTES', 'MAX_CHUNK_SIZE_BYTES', 'MongoMediaStore', 'digest_key']

DEFAULT_CHUNK_SIZE_BYTES: Final = 8 * 1024 * 1024
MAX_CHUNK_SIZE_BYTES: Final = 16 * 1024 * 1024 - 64 * 1024
"""The largest chunk that still fits a 16 MiB document with its other fields."""

_CONTENT: Final = {'digest': 1, 'files_id': 1, 'chunks': 1}
"""The manifest fields that say where a blob's bytes are and what they must hash to."""

_ATTEMPTS: Final = 4
"""How often a `put` looks at the manifest again when other puts keep changing it under it."""


def digest_key(uri: str, context: MediaContext) -> str:
    """The default key strategy of `MongoMediaStore`: the blob's SHA-256 itself."""
    return parse_media_uri(uri)


def _check_chunk_size(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_CHUNK_SIZE_BYTES:
        raise ValueError(f'chunk_size_bytes must be an int from 1 to {MAX_CHUNK_SIZE_BYTES}, got {value!r}')
    return value


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _utc(value: Any) -> datetime:
    """A BSON datetime as aware UTC (clients return naive UTC unless `tz_aware`); missing: long ago."""
    if not isinstance(value, datetime):
        return datetime.min.replace(tzinfo=UTC)
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


@dataclass(frozen=True, slots=True)
class _OnLoop:
    """The collections of a `MongoMediaStore` for one event loop, and their index check (see `_loops.py`)."""

    manifests: AsyncCollection[dict[str, Any]]
    chunks: AsyncCollection[dict[str, Any]]
    indexes: IndexSetup


class MongoMediaStore(ClosesOnExit):
    """Content-addressed blobs in a MongoDB database (see the module docstring for the layout).

    Give exactly one of `client` (a pymongo `AsyncMongoClient` or motor `AsyncIOMotorClient`,
    never closed by the store, used from its own event loop only) or `db_url` (the store builds a
    client for each event loop it is used from in turn, as `MongoStepStore` does, and closes it).
    Putting bytes already stored under the same key writes nothing and keeps the first metadata,
    unless the stored chunks no longer match the digest: then they are written again. Reads
    reassemble the chunks and check them against the digest (`ValueError` if they differ or a
    chunk is missing); so does `touch`, which answers `False` for a damaged blob.
    `key_strategy` picks the manifest's `_id` (default: the SHA-256); `public_url` resolves URLs
    for blobs served by some other means. URIs and keys that are not strings are a `TypeError`.
    """

    def __init__(
        self,
        *,
        client: MongoClientLike | None = None,
        db_url: str | None = None,
        database: str,
        collection: str = 'media',
        chunk_size_bytes: int = DEFAULT_CHUNK_SIZE_BYTES,
        key_strategy: KeyStrategy = digest_key,
        public_url: PublicUrlResolver | None = None,
    ) -> None:
        if not isinstance(collection, str) or not collection:
            raise ValueError(f'collection must be a non-empty str, got {collection!r}')
        chunk_size_bytes = _check_chunk_size(chunk_size_bytes)
        self._start(
            MongoConnection.open(client=client, db_url=db_url),
            closes_connection=True,
            database=database,
            collection=collection,
            chunk_size_bytes=chunk_size_bytes,
            key_strategy=key_strategy,
            public_url=public_url,
        )

    @classmethod
    def sharing(cls, connection: MongoConnection, *, database: str) -> MongoMediaStore:
        """For step_persistence's own use: the default media store of a `MongoStepStore`, on the step store's
        connection (following its client from loop to loop), which it never closes."""
        store = cls.__new__(cls)
        store._start(
            connection,
            closes_connection=False,
            database=database,
            collection='media',
            chunk_size_bytes=DEFAULT_CHUNK_SIZE_BYTES,
            key_strategy=digest_key,
            public_url=None,
        )
        return store

    def _start(
        self,
        connection: MongoConnection,
        *,
        closes_connection: bool,
        database: str,
        collection: str,
        chunk_size_bytes: int,
        key_strategy: KeyStrategy,
        public_url: PublicUrlResolver | None,
    ) -> None:
        self.chunk_size_bytes = chunk_size_bytes
        self._connection = connection
        self._closes_connection = closes_connection
        self._database = connection.database(database).name
        self._collection = collection
        self._full_name = f'{self._database}.{collection}'
        self._on_loop = PerLoop(connection, self._build)
        self._key_strategy = key_strategy
        self._public_url = public_url

    def _build(self, client: MongoClientLike) -> _OnLoop:
        database = self._connection.database(self._database, client)
        chunks = database[f'{self._collection}_chunks']
        return _OnLoop(
            manifests=database[self._collection],
            chunks=chunks,
            indexes=IndexSetup(database, chunk_indexes(chunks.name)),
        )

    def __repr__(self) -> str:
        return f'{type(self).__name__}(collection={self._full_name!r})'

    def key_for(self, uri: str, *, context: MediaContext = NO_CONTEXT) -> str:
        """The manifest `_id` of the blob at `uri` (`ValueError` for a malformed URI or unsafe key).

        `TypeError` if `uri` is not a string: nothing that is not one reaches a query.
        """
        require_text('uri', uri)
        return blob_key(self._key_strategy, uri, context)

    async def put(self, data: bytes, *, context: MediaContext = NO_CONTEXT) -> str:
        """Store `data` (once per key), or check the stored blob and write it again if it is damaged."""
        uri = media_uri_for(data)
        key = self.key_for(uri, context=context)
        digest = parse_media_uri(uri)
        on = self._on_loop.get()
        for _ in range(_ATTEMPTS):
            manifest = await self._touched(on, key)
            if manifest is None:
                if await self._store_new(on, key, digest, data, context):
                    return uri
            elif await self._intact(on, uri, manifest) or await self._replace(on, key, manifest, digest, data):
                return uri
        raise RuntimeError(f'blob {uri} in {self._full_name} kept changing while being stored')

    def _chunk_documents(self, digest: str, data: bytes) -> tuple[str, list[dict[str, Any]]]:
        """A fresh `files_id` for `data` and its chunk documents (each put writes chunks of its own)."""
        files_id = f'{digest}/{self.chunk_size_bytes}/{secrets.token_hex(8)}'
        view = memoryview(data)
        chunks = [
            {'files_id': files_id, 'n': n, 'data': bytes(view[start : start + self.chunk_size_bytes])}
            for n, start in enumerate(range(0, len(view), self.chunk_size_bytes))
        ]
        return files_id, chunks

    def _content(self, digest: str, data: bytes, files_id: str, chunks: int) -> dict[str, Any]:
        return {
            'digest': digest,
            'size': len(data),
            'files_id': files_id,
            'chunk_size': self.chunk_size_bytes,
            'chunks': chunks,
            'touched_at': media_now(),
        }

    async def _store_new(self, on: _OnLoop, key: str, digest: str, data: bytes, context: MediaContext) -> bool:
        """Write the chunks, then the manifest; `False` if another put stored a manifest first (ours go)."""
        await on.indexes.ensure()
        files_id, chunks = self._chunk_documents(digest, data)
        await insert_new(on.chunks, chunks)
        manifest = {
            '_id': key,
            **self._content(digest, data, files_id, len(chunks)),
            'media_type': context.media_type,
            'filename': context.filename,
            'metadata': json.dumps(dict(context.metadata), ensure_ascii=False),
        }
        await insert_new(on.manifests, [manifest])
        if await on.manifests.find_one({'_id': key, 'files_id': files_id}, {'_id': 1}) is not None:
            return True
        await on.chunks.delete_many({'files_id': files_id})
        return False

    async def _replace(self, on: _OnLoop, key: str, manifest: Mapping[str, Any], digest: str, data: bytes) -> bool:
        """Point the damaged blob's manifest at fresh chunks of `data` (keeping its metadata), then drop the old ones.

        `False` if another put (or a deletion) changed the manifest first: ours go, and the caller
        looks at the manifest again.
        """
        await on.indexes.ensure()
        files_id, chunks = self._chunk_documents(digest, data)
        await insert_new(on.chunks, chunks)
        old = manifest.get('files_id')
        unchanged = old if isinstance(old, str) else {'$not': {'$type': 'string'}}  # never a stored operator
        result = await on.manifests.update_one(
            {'_id': key, 'files_id': unchanged}, {'$set': self._content(digest, data, files_id, len(chunks))}
        )
        if not result.matched_count:
            await on.chunks.delete_many({'files_id': files_id})
            return False
        if isinstance(old, str) and await on.manifests.find_one({'files_id': old}, {'_id': 1}) is None:
            await on.chunks.delete_many({'files_id': old})
        return True

    @staticmethod
    async def _touched(on: _OnLoop, key: str) -> dict[str, Any] | None:
        """Refresh the manifest's `touched_at` and return where its bytes are (`None`: no such blob)."""
        manifest: dict[str, Any] | None = await on.manifests.find_one_and_update(
            {'_id': key}, {'$set': {'touched_at': media_now()}}, projection=_CONTENT
        )
        return manifest

    async def _intact(self, on: _OnLoop, uri: str, manifest: Mapping[str, Any]) -> bool:
        """Whether the blob's chunks hash to its digest (read back in full); a damaged blob is logged."""
        digest = parse_media_uri(uri)
        hashed = hashlib.sha256()
        try:
            if manifest.get('digest') != digest:
                raise ValueError(f'blob {uri} is corrupt: its manifest names another digest')
            async for part in self._parts(on, uri, manifest):
                hashed.update(part)
            if hashed.hexdigest() != digest:
                raise ValueError(f'blob {uri} is corrupt: its bytes hash to sha256 {hashed.hexdigest()}')
        except ValueError as error:
            logger.warning('blob %s in %s is damaged, it will be written again: %s', uri, self._full_name, error)
            return False
        return True

    async def touch(self, uri: str, *, context: MediaContext = NO_CONTEXT) -> bool:
        """Refresh the blob's touched time; whether it is stored intact (its chunks are read back and hashed).

        A damaged blob (logged) answers `False`, so that the caller puts its bytes again.
        """
        key = self.key_for(uri, context=context)
        on = self._on_loop.get()
        manifest = await self._touched(on, key)
        return manifest is not None and await self._intact(on, uri, manifest)

    async def list_blobs(self) -> AsyncIterator[StoredBlob]:
        async for manifest in self._on_loop.get().manifests.find({}, {'_id': 1, 'touched_at': 1}):
            key = manifest['_id']
            uri = uri_of_key(key) if isinstance(key, str) else None
            if uri is not None:
                yield StoredBlob(uri, key, _utc(manifest.get('touched_at')))

    async def delete_blob(self, blob: StoredBlob, *, touched_before: datetime | None = None) -> bool:
        """Delete the manifest (checking its touched time in the same operation), then its chunks."""
        require_text('blob.key', blob.key)
        if touched_before is not None and not isinstance(touched_before, datetime):
            raise TypeError(f'touched_before must be a datetime or None, not {type(touched_before).__name__}')
        query: dict[str, Any] = {'_id': blob.key}
        if touched_before is not None:
            query['$or'] = [{'touched_at': {'$lt': touched_before}}, {'touched_at': {'$exists': False}}]
        on = self._on_loop.get()
        manifest = await on.manifests.find_one_and_delete(query, projection={'files_id': 1})
        if manifest is None:
            return False
        files_id = manifest.get('files_id')
        if isinstance(files_id, str) and await on.manifests.find_one({'files_id': files_id}, {'_id': 1}) is None:
            await on.chunks.delete_many({'files_id': files_id})
        return True

    async def _manifest(self, uri: str, context: MediaContext) -> tuple[_OnLoop, dict[str, Any]]:
        """The blob's manifest (`FileNotFoundError` if there is none), and the collections it was read from."""
        key = self.key_for(uri, context=context)
        on = self._on_loop.get()
        manifest = await on.manifests.find_one({'_id': key})
        if manifest is None:
            raise FileNotFoundError(f'blob {uri} is not in {self._full_name}')
        return on, manifest

    async def get(self, uri: str, *, context: MediaContext = NO_CONTEXT) -> bytes:
        on, manifest = await self._manifest(uri, context)
        return check_digest(uri, b''.join([part async for part in self._parts(on, uri, manifest)]))

    @staticmethod
    async def _parts(on: _OnLoop, uri: str, manifest: Mapping[str, Any]) -> AsyncIterator[bytes]:
        """The blob's chunks in order; `ValueError` ("corrupt") for a malformed manifest or a missing chunk."""
        count, files_id = _count(manifest.get('chunks')), manifest.get('files_id')
        if count is None or not isinstance(files_id, str):
            raise ValueError(f'blob {uri} is corrupt: its manifest is malformed')
        seen = 0
        async for chunk in on.chunks.find({'files_id': files_id, 'n': {'$lt': count}}, {'_id': 0}).sort('n'):
            if chunk.get('n') != seen or not isinstance(chunk.get('data'), bytes):
                raise ValueError(f'blob {uri} is corrupt: chunk {seen} is missing or malformed')
            seen += 1
            yield chunk['data']
        if seen != count:
            raise ValueError(f'blob {uri} is corrupt: {count - seen} of its {count} chunks are missing')

    async def exists(self, uri: str, *, context: MediaContext = NO_CONTEXT) -> bool:
        key = self.key_for(uri, context=context)
        return await self._on_loop.get().manifests.find_one({'_id': key}, {'_id': 1}) is not None

    async def public_url(self, uri: str, *, context: MediaContext = NO_CONTEXT) -> str | None:
        require_text('uri', uri)
        return await resolve_public_url(self._public_url, uri, context)

    async def get_metadata(self, uri: str, *, context: MediaContext = NO_CONTEXT) -> Mapping[str, str]:
        _, manifest = await self._manifest(uri, context)
        try:
            metadata = json.loads(manifest['metadata'])
        except (KeyError, TypeError, ValueError):
            metadata = None
        if not isinstance(metadata, dict) or not all(
            isinstance(key, str) and isinstance(value, str) for key, value in metadata.items()
        ):
            raise ValueError(f'metadata of blob {uri} is malformed')
        return metadata

    async def aclose(self) -> None:
        """Close the client if the store built it from `db_url`; a caller's client stays open, and so does the
        client of the step store whose default media store this is (the step store closes it)."""
        if self._closes_connection:
            await self._connection.aclose()
