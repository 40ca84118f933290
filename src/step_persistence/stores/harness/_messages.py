"""pydantic-ai-harness's stored messages back to pydantic-ai messages, its externalized payloads restored.

The harness moves a payload out of a message into its media store and leaves a *marker* where it
was: the dict of the part or of the `BinaryContent`, without its payload, with
`__harness_external_media__: true`, the blob's `media+sha256://` URI (as
`__harness_external_uri__`, and again as `uri`), and

- `__harness_external_text__: true` for a text payload: a part's `content`;
- for a binary payload (a `BinaryContent`'s `data`), nothing more in the older shape, or
  `__harness_external_urlsafe__: 'base64-urlsafe-v1'` in the newer one. Both hold the same bytes
  (the blob is the payload itself), so both restore the same way.

Restoring puts the payload back where the marker names it and removes the marker's keys; the
messages are then validated as pydantic-ai's JSON (`ModelMessagesTypeAdapter`), as the harness
wrote them.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from step_persistence.media.uri import check_digest, parse_media_uri

if TYPE_CHECKING:
    from pydantic_ai.messages import ModelMessage

__all__ = ['BlobReader', 'MessagesColumn', 'marker_uris', 'restore_messages']


@dataclass(frozen=True)
class MessagesColumn:
    """A stored snapshot's `messages` field, in any of the harness's spellings: the messages themselves (a
    JSON list, as older releases and its file store write it), `{"message_refs": [sha256, ...]}` (its
    PostgreSQL and MongoDB stores), or `{"stored_messages": n}` (its SQLite store: the references are rows
    of their own)."""

    inline: list[Any] | None = None
    refs: list[str] | None = None
    count: int | None = None

    @classmethod
    def parse(cls, stored: object) -> MessagesColumn:
        """The field as stored (JSON text, or a decoded value); an unknown spelling holds nothing (its
        snapshot is then unreadable)."""
        try:
            value = json.loads(stored) if isinstance(stored, str | bytes) else stored
        except ValueError:
            return cls()
        if isinstance(value, list):
            return cls(inline=value)
        if isinstance(value, dict):
            refs, count = value.get('message_refs'), value.get('stored_messages')
            if isinstance(refs, list) and all(isinstance(digest, str) for digest in refs):
                return cls(refs=refs)
            if isinstance(count, int) and not isinstance(count, bool):
                return cls(count=count)
        return cls()

    def resolve(self, stored: Mapping[str, object], refs: list[str] | None = None) -> list[Any] | None:
        """The messages as JSON: inline ones, or the referenced ones (`refs`: those of a `count` spelling)
        looked up in `stored` (digest -> message JSON text); `None` when one is missing or damaged."""
        if self.inline is not None:
            return self.inline
        refs = self.refs if self.refs is not None else refs
        if refs is None or (self.count is not None and len(refs) != self.count):
            return None
        try:
            return [json.loads(stored[digest]) for digest in refs]  # type: ignore[arg-type]
        except (KeyError, ValueError, TypeError):
            return None


BlobReader = Callable[[str], Awaitable[bytes]]
"""The bytes of the blob with this `media+sha256://` URI (`LookupError` if the store has none)."""

_MEDIA = '__harness_external_media__'
_URI = '__harness_external_uri__'
_TEXT = '__harness_external_text__'
_MARKER_PREFIX = '__harness_external_'


def _markers(node: object) -> Iterator[dict[str, Any]]:
    if isinstance(node, dict):
        if node.get(_MEDIA) is True:
            yield node
            return
        for value in node.values():
            yield from _markers(value)
    elif isinstance(node, list):
        for item in node:
            yield from _markers(item)


def marker_uris(messages: list[Any]) -> list[str]:
    """The URIs of every blob the messages' markers name, first mention first, each once."""
    uris: dict[str, None] = {}
    for marker in _markers(messages):
        uri = marker.get(_URI)
        if not isinstance(uri, str):
            raise ValueError('a harness media marker without its URI')
        parse_media_uri(uri)
        uris[uri] = None
    return list(uris)


def _restored(node: object, blobs: dict[str, bytes]) -> object:
    if isinstance(node, list):
        return [_restored(item, blobs) for item in node]
    if not isinstance(node, dict):
        return node
    if node.get(_MEDIA) is not True:
        return {key: _restored(value, blobs) for key, value in node.items()}
    uri = node[_URI]
    kept = {key: value for key, value in node.items() if not key.startswith(_MARKER_PREFIX)}
    if kept.get('uri') == uri:
        del kept['uri']
    data = blobs[uri]
    if node.get(_TEXT) is True:
        kept['content'] = data.decode('utf-8')
    else:
        kept['data'] = base64.b64encode(data).decode('ascii')
    return kept


async def restore_messages(messages: list[Any], read_blob: BlobReader) -> list[ModelMessage]:
    """The harness's JSON messages (a list of message dicts) as pydantic-ai messages, every marker's payload
    read through `read_blob` and put back.

    Raises `ValueError` for messages pydantic-ai cannot read or a marker that names no URI, and what
    `read_blob` raises for a blob it cannot find.
    """
    from pydantic_ai.messages import ModelMessagesTypeAdapter

    if not isinstance(messages, list):
        raise ValueError(f'a snapshot holds a list of messages, not {type(messages).__name__}')
    blobs = {uri: check_digest(uri, await read_blob(uri)) for uri in marker_uris(messages)}
    return ModelMessagesTypeAdapter.validate_json(json.dumps(_restored(messages, blobs)))
