"""The inspector's gate, one ASGI middleware around every route: read-only, same-origin, tokened when asked.

For every HTTP request, in order:

1. a method other than GET or HEAD is refused with 405 (the inspector never writes);
2. with `allowed_hosts`, a `Host` header naming another host is refused with 400 (a page of another
   site that rebinds its DNS name to 127.0.0.1 would otherwise read the store through the browser);
3. with a `token`, `?token=TOKEN` is checked once and answered with a redirect to the same page
   without it, setting an `HttpOnly`, `SameSite=Strict` cookie that later requests carry; a request
   with neither a valid token nor the cookie gets 401;
4. every response gets the security headers (`SECURITY_HEADERS`: a strict Content-Security-Policy,
   `nosniff`, no framing, no referrer, no caching); a response that set its own
   Content-Security-Policy (the media route's stricter one) keeps it.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Collection

from starlette.datastructures import MutableHeaders
from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ['CONTENT_SECURITY_POLICY', 'COOKIE_NAME', 'SECURITY_HEADERS', 'Guard']

COOKIE_NAME = 'step_persistence_inspector'

CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
"""Scripts, styles and images from the inspector's own origin only: no inline script or style runs,
whatever a stored string holds."""

SECURITY_HEADERS = {
    'Content-Security-Policy': CONTENT_SECURITY_POLICY,
    'X-Content-Type-Options': 'nosniff',
    'X-Frame-Options': 'DENY',
    'Referrer-Policy': 'no-referrer',
    'Cache-Control': 'no-store',
}

_READ_METHODS = ('GET', 'HEAD')


def _cookie_value(token: str) -> str:
    """What the cookie holds: a digest of the token (hex, so no cookie quoting), not the token itself."""
    return hmac.new(token.encode(), b'step-persistence inspector cookie', hashlib.sha256).hexdigest()


class Guard:
    """Wraps the inspector's application with the checks above; `token=None` and `allowed_hosts=None` skip theirs."""

    def __init__(self, app: ASGIApp, *, token: str | None, allowed_hosts: Collection[str] | None) -> None:
        self._app = app
        self._token = token
        self._cookie = None if token is None else _cookie_value(token)
        self._hosts = None if allowed_hosts is None else frozenset(host.lower() for host in allowed_hosts)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope['type'] != 'http':
            await self._app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message['type'] == 'http.response.start':
                headers = MutableHeaders(scope=message)
                for name, value in SECURITY_HEADERS.items():
                    if name not in headers:
                        headers[name] = value
            await send(message)

        refusal = self._refusal(Request(scope))
        if refusal is not None:
            await refusal(scope, receive, send_with_headers)
            return
        await self._app(scope, receive, send_with_headers)

    def _refusal(self, request: Request) -> Response | None:
        """The response that ends `request` here, or `None` to let it through."""
        if request.method not in _READ_METHODS:
            return PlainTextResponse(
                'The inspector is read-only: only GET and HEAD are served.', 405, headers={'Allow': 'GET, HEAD'}
            )
        if self._hosts is not None and (request.url.hostname or '').lower() not in self._hosts:
            return PlainTextResponse('Unexpected Host header: open the inspector by the address it printed.', 400)
        if self._token is None or self._cookie is None:
            return None
        given = request.query_params.get('token')
        if given is not None:
            if not hmac.compare_digest(given.encode(), self._token.encode()):
                return PlainTextResponse('Wrong token.', 401)
            query = request.url.remove_query_params('token').query
            response = RedirectResponse(request.url.path + (f'?{query}' if query else ''), status_code=303)
            cookie_path = request.scope.get('root_path') or '/'  # the mount path, when an application mounts it
            response.set_cookie(COOKIE_NAME, self._cookie, httponly=True, samesite='strict', path=cookie_path)
            return response
        if hmac.compare_digest(request.cookies.get(COOKIE_NAME, '').encode(), self._cookie.encode()):
            return None
        return PlainTextResponse(
            'This inspector needs its token: open the address `step-persistence serve` printed (ending in ?token=...).',
            401,
        )
