"""A snapshot's messages as the inspector shows them: one view per message, one per part.

Messages are read through pydantic-ai's own dump (`ModelMessagesTypeAdapter.dump_python`), so
every part kind it knows (and any it adds later) is shown: user prompts, system prompts,
instructions, text, thinking, tool calls with their arguments, tool returns (a retry is a return
whose outcome is `retried`, or an older `retry-prompt` part), files. Binary content becomes a
`MediaView` (shown inline when it is a raster image), URLs become links (only `http(s)` ones are
clickable), and anything else is shown as JSON. Text longer than `COLLAPSE_CHARS` or
`COLLAPSE_LINES` is collapsed. Every string here is stored data; the templates escape it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from step_persistence.inspector.media import as_blob

if TYPE_CHECKING:
    from pydantic_ai.messages import ModelMessage

__all__ = ['COLLAPSE_CHARS', 'COLLAPSE_LINES', 'LinkView', 'MediaView', 'MessageView', 'PartView', 'message_views']

COLLAPSE_CHARS = 800
COLLAPSE_LINES = 16

_TITLES = {
    'system-prompt': 'system prompt',
    'user-prompt': 'user prompt',
    'tool-return': 'tool return',
    'builtin-tool-return': 'built-in tool return',
    'retry-prompt': 'retry',
    'retry-feedback': 'retry',
    'text': 'text',
    'thinking': 'thinking',
    'tool-call': 'tool call',
    'builtin-tool-call': 'built-in tool call',
    'file': 'file',
}


@dataclass(frozen=True)
class MediaView:
    """A binary payload: its digest (to fetch it), media type and size, and whether it is shown inline."""

    digest: str
    media_type: str
    size: int
    inline: bool


@dataclass(frozen=True)
class LinkView:
    """A URL a part refers to (`image-url`, `document-url`, ...); `safe` when it is http(s) and may be a link."""

    url: str
    kind: str
    safe: bool


@dataclass(frozen=True)
class PartView:
    """One message part."""

    kind: str
    """pydantic-ai's `part_kind`."""
    title: str
    tool_name: str | None
    tool_call_id: str | None
    text: str
    outcome: str | None
    """A tool return's outcome when it is not `success` (`retried`, `failed`, ...)."""
    media: list[MediaView] = field(default_factory=list[MediaView])
    links: list[LinkView] = field(default_factory=list[LinkView])

    @property
    def collapsed(self) -> bool:
        return len(self.text) > COLLAPSE_CHARS or self.text.count('\n') >= COLLAPSE_LINES

    @property
    def preview(self) -> str:
        """The first line of a collapsed part, cut short."""
        first = self.text.split('\n', 1)[0]
        return first[:120] + ('...' if len(first) > 120 else '')


@dataclass(frozen=True)
class MessageView:
    """One message: request or response, with its parts."""

    number: int
    kind: str
    parts: list[PartView]
    model_name: str | None
    timestamp: datetime | None
    instructions: str | None
    input_tokens: int | None
    output_tokens: int | None


def _json(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, default=str)


class _Content:
    """What one part's content becomes: text, media and links, gathered in order."""

    def __init__(self) -> None:
        self.texts: list[str] = []
        self.media: list[MediaView] = []
        self.links: list[LinkView] = []

    def add(self, value: Any) -> None:
        if value is None:
            return
        if isinstance(value, str):
            self.texts.append(value)
            return
        if isinstance(value, list):
            for item in value:
                self.add(item)
            return
        blob = as_blob(value)
        if blob is not None:
            self.media.append(MediaView(blob.digest, blob.media_type, len(blob.data), blob.inline))
            return
        if (
            isinstance(value, dict)
            and isinstance(value.get('url'), str)
            and str(value.get('kind', '')).endswith('-url')
        ):
            url = value['url']
            self.links.append(
                LinkView(url=url, kind=str(value['kind']), safe=url.lower().startswith(('http://', 'https://')))
            )
            return
        self.texts.append(_json(value))


def _arguments(args: Any) -> str:
    """A tool call's arguments as indented JSON (arguments stored as a JSON string are parsed first)."""
    if isinstance(args, str):
        try:
            return _json(json.loads(args))
        except ValueError:
            return args
    return '' if args is None else _json(args)


def _part_view(part: dict[str, Any]) -> PartView:
    kind = str(part.get('part_kind', 'unknown'))
    outcome = part.get('outcome')
    content = _Content()
    if kind in ('tool-call', 'builtin-tool-call'):
        content.texts.append(_arguments(part.get('args')))
    else:
        content.add(part.get('content'))
    title = _TITLES.get(kind, kind)
    if outcome == 'retried':
        title = 'retry'
    tool_name, call_id = part.get('tool_name'), part.get('tool_call_id')
    return PartView(
        kind=kind,
        title=title,
        tool_name=tool_name if isinstance(tool_name, str) else None,
        tool_call_id=call_id if isinstance(call_id, str) else None,
        text='\n'.join(content.texts),
        outcome=outcome if isinstance(outcome, str) and outcome != 'success' else None,
        media=content.media,
        links=content.links,
    )


def _tokens(message: dict[str, Any], name: str) -> int | None:
    usage = message.get('usage')
    value = usage.get(name) if isinstance(usage, dict) else None
    return value if isinstance(value, int) else None


def message_views(messages: Sequence[ModelMessage]) -> list[MessageView]:
    """The views of `messages`, numbered from 1."""
    from pydantic_ai.messages import ModelMessagesTypeAdapter

    views: list[MessageView] = []
    for number, message in enumerate(ModelMessagesTypeAdapter.dump_python(list(messages)), start=1):
        model_name, instructions, timestamp = (
            message.get('model_name'),
            message.get('instructions'),
            message.get('timestamp'),
        )
        views.append(
            MessageView(
                number=number,
                kind=str(message.get('kind', 'unknown')),
                parts=[_part_view(part) for part in message.get('parts', []) if isinstance(part, dict)],
                model_name=model_name if isinstance(model_name, str) else None,
                timestamp=timestamp if isinstance(timestamp, datetime) else None,
                instructions=instructions if isinstance(instructions, str) else None,
                input_tokens=_tokens(message, 'input_tokens'),
                output_tokens=_tokens(message, 'output_tokens'),
            )
        )
    return views
