"""Store URLs: their scheme, and the one redactor every message, log line and repr uses.

A store URL may carry a password in its userinfo (`postgresql://app:secret@host/db`) or in a
query parameter (`?password=...`, which asyncpg and libpq accept), and its scheme may be written
in any case. Redaction parses the URL rather than matching a pattern, so a password holding `/`,
`?`, `#` or `@` is hidden whole; where the URL is ambiguous, more is hidden, never less.
"""

from __future__ import annotations

import re
from urllib.parse import parse_qsl, quote

__all__ = ['REDACTED', 'redact_text', 'redact_url', 'url_scheme']

REDACTED = '***'

_SCHEME = re.compile(r'[A-Za-z][A-Za-z0-9+.\-]*://')
_URL_IN_TEXT = re.compile(r'[A-Za-z][A-Za-z0-9+.\-]*://[^\s\'"<>]*')
_SECRET_PARAMETER = re.compile(r'pass|pwd|secret|token|credential|api_?key|auth', re.IGNORECASE)


def url_scheme(url: str) -> str | None:
    """The backend part of a URL's scheme, lower-cased (`'postgresql'` for `POSTGRESQL+asyncpg://...`).

    `None` when `url` has no `scheme://`.
    """
    found = _SCHEME.match(url)
    if found is None:
        return None
    return found.group()[:-3].partition('+')[0].lower()


def redact_url(url: str) -> str:
    """`url` with every password (userinfo or password-like query parameter) replaced by `***`.

    A string that does not start with `scheme://` (a message quoting URLs, for instance) goes
    through `redact_text`; one that does is taken whole as the URL, so a password holding a space
    is hidden too.
    """
    found = _SCHEME.match(url)
    if found is None:
        return redact_text(url)
    scheme, rest = found.group(), url[found.end() :]
    authority_end = min((rest.index(mark) for mark in '/?#' if mark in rest), default=len(rest))
    at = rest.rfind('@', 0, authority_end)
    if at < 0:
        # A password holding '/', '?' or '#' ends the authority early: the userinfo then runs to the last '@'.
        at = rest.rfind('@')
    if at >= 0:
        user, colon, _ = rest[:at].partition(':')
        rest = f'{user}:{REDACTED}@{rest[at + 1 :]}' if colon else rest
    return scheme + _redact_query(rest)


def _redact_query(rest: str) -> str:
    before, mark, query = rest.partition('?')
    if not mark:
        return rest
    query, hash_mark, fragment = query.partition('#')
    parts = []
    for name, value in parse_qsl(query, keep_blank_values=True):
        shown = REDACTED if _SECRET_PARAMETER.search(name) else quote(value, safe='')
        parts.append(f'{quote(name, safe="")}={shown}')
    return f'{before}?{"&".join(parts)}{hash_mark}{fragment}'


def redact_text(text: str) -> str:
    """`text` with every URL in it redacted (an error message that quotes a URL, for instance)."""
    return _URL_IN_TEXT.sub(lambda match: redact_url(match.group()), text)
