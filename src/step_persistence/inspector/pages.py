"""The inspector's HTML: the Jinja2 environment over the packaged templates, its filters, and `render`.

Autoescaping is on for every template, so a stored string is always text in the page (a `<script>`
in a tool result shows as `<script>`). Every value a template prints also goes through `visible`
first, which shows control characters and bidirectional overrides as `\\xNN`/`\\uNNNN` instead of
letting them reorder or hide what is around them (newlines and tabs are kept).
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from functools import cache
from typing import Any
from urllib.parse import urlencode

from jinja2 import Environment, PackageLoader, StrictUndefined, pass_context
from jinja2.runtime import Context
from markupsafe import Markup
from starlette.responses import HTMLResponse

__all__ = ['duration', 'href', 'render', 'visible', 'when']

_CONTROL = re.compile('[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]')


def _shown(character: re.Match[str]) -> str:
    code = ord(character.group())
    return f'\\x{code:02x}' if code < 0x100 else f'\\u{code:04x}'


def visible(text: str) -> str:
    """`text` with control characters (but newline and tab) and bidirectional overrides spelled out."""
    return _CONTROL.sub(_shown, text)


def _finalize(value: Any) -> Any:
    """What a template prints for `value`: nothing for `None`, stored strings made `visible`."""
    if value is None:
        return ''
    if isinstance(value, str) and not isinstance(value, Markup):
        return visible(value)
    return value


def when(moment: datetime | None) -> str:
    """An instant as the pages show it: UTC, to the second."""
    if moment is None:
        return ''
    return moment.astimezone(UTC).strftime('%Y-%m-%d %H:%M:%S UTC')


def duration(seconds: float | None) -> str:
    """A duration for people: `850 ms`, `12.3 s`, `4 min 05 s`, `2 h 03 min`."""
    if seconds is None:
        return ''
    if seconds < 1:
        return f'{seconds * 1000:.0f} ms'
    if seconds < 60:
        return f'{seconds:.1f} s'
    minutes, rest = divmod(int(seconds), 60)
    if minutes < 60:
        return f'{minutes} min {rest:02d} s'
    hours, minutes = divmod(minutes, 60)
    return f'{hours} h {minutes:02d} min'


def href(root_path: str, path: str, **params: object) -> str:
    """`path` under the application's `root_path` (where it is mounted, `''` at the server's root), with
    `params` as its query string, each value URL-encoded (`None` values left out)."""
    query = urlencode({name: value for name, value in params.items() if value is not None and value != ''})
    return f'{root_path}{path}?{query}' if query else f'{root_path}{path}'


@pass_context
def _href(context: Context, path: str, **params: object) -> str:
    """`href` under the page's `root_path` (templates call it as `href(path, **params)`)."""
    return href(context.get('root_path', ''), path, **params)


@cache
def _environment() -> Environment:
    environment = Environment(
        loader=PackageLoader('step_persistence.inspector', 'templates'),
        autoescape=True,
        finalize=_finalize,
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    environment.filters.update(when=when, duration=duration)
    environment.globals.update(href=_href)
    return environment


def render(template: str, context: dict[str, Any], *, status_code: int = 200) -> HTMLResponse:
    """The page `template` renders with `context`."""
    return HTMLResponse(_environment().get_template(template).render(context), status_code=status_code)
