"""`runs messages`: a snapshot's message history as JSON or as text, with binary content as media references.

Stores restore media inline (the original bytes), so here every `bytes` value of the history is
replaced by `{"media_uri": "media+sha256://...", "size": N}`: the content address the media store
keeps it under, next to the part's own `media_type`. The JSON is otherwise pydantic-ai's own
(`ModelMessagesTypeAdapter`), with instants spelled as everywhere else in the command line's JSON.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from step_persistence.cli._common import escape, json_timestamp, when

if TYPE_CHECKING:
    from pydantic_ai.messages import ModelMessage

    from step_persistence.records import ContinuableSnapshot

__all__ = ['history_text', 'history_tree']

_TEXT_KEYS = ('content', 'args')


def _media_reference(data: bytes) -> dict[str, Any]:
    from step_persistence.media.uri import media_uri_for

    return {'media_uri': media_uri_for(data), 'size': len(data)}


def _without_bytes(value: Any) -> Any:
    if isinstance(value, bytes | bytearray | memoryview):
        return _media_reference(bytes(value))
    if isinstance(value, dict):
        return {key: _without_bytes(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_without_bytes(item) for item in value]
    return value


def history_tree(messages: Sequence[ModelMessage]) -> list[Any]:
    """The messages as pydantic-ai dumps them (Python values), binary content as media references."""
    from pydantic_ai.messages import ModelMessagesTypeAdapter

    return [_without_bytes(message) for message in ModelMessagesTypeAdapter.dump_python(list(messages))]


def _plain(value: Any) -> Any:
    from datetime import datetime

    if isinstance(value, datetime):
        return json_timestamp(value)
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_plain(item) for item in value]
    return value


def _content(value: Any) -> str:
    """One part's content for people: text as it is, media as `<media URI type, N bytes>`, the rest as JSON."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return '\n'.join(_content(item) for item in value)
    if isinstance(value, dict):
        reference = value.get('data')
        if value.get('kind') == 'binary' and isinstance(reference, dict) and 'media_uri' in reference:
            kind = value.get('media_type') or 'binary'
            return f'<media {reference["media_uri"]} {kind}, {reference["size"]} bytes>'
        if isinstance(value.get('url'), str) and str(value.get('kind', '')).endswith('-url'):
            return f'<{value["kind"]} {value["url"]}>'
    return json.dumps(_plain(value), ensure_ascii=False, default=str)


def _part_line(part: dict[str, Any]) -> str:
    kind = str(part.get('part_kind', '?'))
    label = f'[bold]{escape(kind)}[/]'
    if part.get('tool_name'):
        label += f' {escape(str(part["tool_name"]))}'
    if part.get('tool_call_id'):
        label += f' [dim]({escape(str(part["tool_call_id"]))})[/]'
    body = next((part[key] for key in _TEXT_KEYS if part.get(key) is not None), '')
    text = _content(body)
    indented = text.replace('\n', '\n      ')
    return f'    {label}: {escape(indented)}' if text else f'    {label}'


def history_text(run_id: str, snapshot: ContinuableSnapshot, total: int) -> list[str]:
    """The snapshot's messages as lines of rich markup (every stored string escaped)."""
    lines = [
        f'Run [bold]{escape(run_id)}[/], snapshot {snapshot.seq} ({total} retained): {escape(snapshot.state)}, '
        f'step {snapshot.step_index}, {when(snapshot.timestamp)}, {len(snapshot.messages)} message(s)'
    ]
    for number, message in enumerate(history_tree(snapshot.messages), start=1):
        kind = str(message.get('kind', '?'))
        heading = f'\n[bold cyan]{number}. {escape(kind)}[/]'
        if message.get('model_name'):
            heading += f'  {escape(str(message["model_name"]))}'
        if message.get('timestamp') is not None:
            heading += f'  {when(message["timestamp"])}'
        lines.append(heading)
        if message.get('instructions'):
            lines.append(f'    [bold]instructions[/]: {escape(str(message["instructions"]))}')
        lines.extend(_part_line(part) for part in message.get('parts', []))
    return lines
