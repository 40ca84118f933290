"""How step stores move large message payloads into a media store and back (one rule for every backend)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from step_persistence._history import EncodedMessage
from step_persistence.media.protocol import MediaStore
from step_persistence.media.walker import (
    DEFAULT_THRESHOLD_BYTES,
    externalize_media,
    needs_externalizing,
    restore_media,
    validate_threshold_bytes,
)

__all__ = ['DEFAULT_THRESHOLD_BYTES', 'MediaSetting', 'MessageMedia', 'PackedMessage']

MediaSetting = MediaStore | Literal['auto'] | None
"""A store's `media_store=` argument: a media store, `'auto'` for the backend's default, or `None` for inline."""


@dataclass(frozen=True, slots=True)
class PackedMessage:
    """A message as a store persists it: its JSON, and whether that JSON holds media markers."""

    data: bytes
    externalized: bool
    """Whether the media walker changed the message: read it back through `MessageMedia.unpack`."""


@dataclass(frozen=True)
class MessageMedia:
    """A step store's media policy: where payloads go (`None`: stay inline) and from what size."""

    store: MediaStore | None
    threshold_bytes: int

    @classmethod
    def resolve(
        cls, setting: MediaSetting, threshold_bytes: int, *, default: Callable[[], MediaStore] | None
    ) -> MessageMedia:
        """The policy for a store's arguments; `default` builds the backend's own media store for `'auto'`."""
        threshold = validate_threshold_bytes(threshold_bytes)
        if setting == 'auto':
            return cls(store=None if default is None else default(), threshold_bytes=threshold)
        if setting is not None and not isinstance(setting, MediaStore):
            raise TypeError(f"media_store must be a MediaStore, 'auto' or None, got {type(setting).__name__}")
        return cls(store=setting, threshold_bytes=threshold)

    async def pack(self, tree: Any) -> tuple[Any, bool]:
        """The tree to persist for a message, and whether it went through the media walker."""
        if self.store is None:
            return tree, False
        return await externalize_media(tree, media_store=self.store, threshold_bytes=self.threshold_bytes), True

    async def pack_changed(self, tree: Any) -> tuple[Any, bool]:
        """The tree to persist, and whether the media walker changed it (only then read it back with `unpack`)."""
        if self.store is None:
            return tree, False
        packed = await externalize_media(tree, media_store=self.store, threshold_bytes=self.threshold_bytes)
        return packed, packed is not tree

    def packed_inline(self, message: EncodedMessage) -> PackedMessage | None:
        """`pack_message`'s result when it involves no media store (none, or nothing to move out), else
        `None`; synchronous, so a caller in a worker thread goes back to the event loop only when needed."""
        if self.store is None or not needs_externalizing(message.tree(), threshold_bytes=self.threshold_bytes):
            return PackedMessage(message.data, externalized=False)
        return None

    async def pack_message(self, message: EncodedMessage) -> PackedMessage:
        """The JSON to persist for `message`: its own bytes, untouched, unless it has payloads to move out.

        Only a message the walker changed is marked `externalized`, so a message without large
        payloads reads back with no media store involved (and is readable by a store opened with
        `media_store=None`).
        """
        if self.store is None:
            return PackedMessage(message.data, externalized=False)
        tree = message.tree()
        packed = await externalize_media(tree, media_store=self.store, threshold_bytes=self.threshold_bytes)
        if packed is tree:
            return PackedMessage(message.data, externalized=False)
        return PackedMessage(_json_bytes(packed), externalized=True)

    async def unpack(self, tree: Any, *, externalized: bool) -> Any:
        """The message tree as it was before `pack`; raises `ValueError` if it needs a media store this one lacks."""
        if not externalized:
            return tree
        if self.store is None:
            raise ValueError('this message was stored with its payloads in a media store; open the store with one')
        return await restore_media(tree, media_store=self.store)

    async def unpack_message(self, data: bytes | str, *, externalized: bool) -> Any:
        """The JSON tree of a message that `pack_message` gave `data` for; payloads put back in place."""
        return await self.unpack(json.loads(data), externalized=externalized)


def _json_bytes(tree: Any) -> bytes:
    """Compact UTF-8 JSON; a string that is not valid Unicode (a lone surrogate) forces `\\u` escapes."""
    text = json.dumps(tree, ensure_ascii=False, separators=(',', ':'))
    try:
        return text.encode('utf-8')
    except UnicodeEncodeError:
        return json.dumps(tree, separators=(',', ':')).encode('ascii')
