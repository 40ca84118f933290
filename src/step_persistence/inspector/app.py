"""The inspector's ASGI application: its routes over one open store, behind the `Guard`.

| route | page |
|---|---|
| `/` | the runs, newest first (`?status=&agent=&conversation=&q=&start=&size=`) |
| `/run?id=RUN` | one run: lineage, ledger, timeline, snapshots |
| `/run/state?id=RUN` | the run's state as JSON, polled by the run page to refresh itself |
| `/run/messages?id=RUN&seq=N` | the messages of one snapshot |
| `/media?run=RUN&seq=N&digest=SHA256` | one blob of that snapshot, with its stored media type |
| `/conversations`, `/conversation?id=ID` | the conversations, and one as a tree of its runs |
| `/static/...` | the stylesheet, the one script and the icon, packaged with the wheel |

Ids travel in query strings, so any stored id (slashes, spaces, markup) makes a working link. The
store is only read. A store that cannot be read gives a 503 page with the error, and logs its
traceback (passwords redacted in both); a bad parameter, 400.
"""

from __future__ import annotations

import logging
import traceback
from collections.abc import Awaitable, Callable, Collection
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from step_persistence._urls import redact_text, redact_url
from step_persistence.inspector import queries
from step_persistence.inspector.guard import Guard
from step_persistence.inspector.media import find_blob, is_digest
from step_persistence.inspector.messages import message_views
from step_persistence.inspector.pages import render
from step_persistence.protocol import StepStore
from step_persistence.records import RUN_STATUSES

__all__ = ['DEFAULT_REFRESH_SECONDS', 'create_app']

DEFAULT_REFRESH_SECONDS = 2.0
"""How often the page of a run that has not ended asks whether it changed."""

logger = logging.getLogger('step_persistence.inspector')

Handler = Callable[[Request], Awaitable[Response]]

MEDIA_CONTENT_SECURITY_POLICY = "default-src 'none'; sandbox"
"""A blob opened on its own runs nothing, whatever its media type claims."""


class _BadRequest(Exception):
    """A query parameter that is missing or malformed."""


def _text(request: Request, name: str) -> str:
    value = request.query_params.get(name)
    if not value:
        raise _BadRequest(f'the {name!r} parameter is required')
    return value


def _number(request: Request, name: str, default: int | None = None) -> int:
    value = request.query_params.get(name)
    if value in (None, '') and default is not None:
        return default
    if value is None or not value.isascii() or not value.isdigit():
        raise _BadRequest(f'the {name!r} parameter must be a whole number')
    return int(value)


class _Inspector:
    """The route handlers over one store."""

    def __init__(self, store: StepStore, store_label: str, refresh_seconds: float) -> None:
        self.store = store
        self.context: dict[str, Any] = {'store_label': store_label}
        self.refresh_ms = round(refresh_seconds * 1000)

    def page(self, request: Request, template: str, status_code: int = 200, **context: Any) -> Response:
        root_path = request.scope.get('root_path', '')
        return render(template, {**self.context, 'root_path': root_path, **context}, status_code=status_code)

    def guarded(self, handler: Handler) -> Handler:
        """`handler`, with bad parameters answered 400 and store failures 503 (logged, redacted)."""

        async def endpoint(request: Request) -> Response:
            try:
                return await handler(request)
            except (_BadRequest, TypeError, ValueError) as error:
                return self.page(request, 'error.html', 400, title='Bad request', message=str(error))
            except HTTPException:
                raise
            except Exception as error:
                # The traceback goes to the log as text, redacted: a driver's error can hold the store's URL.
                logged = redact_text(''.join(traceback.format_exception(error)))
                logger.error('the inspector could not read the store:\n%s', logged)
                message = redact_text(f'{type(error).__name__}: {error}')
                return self.page(request, 'error.html', 503, title='The store could not be read', message=message)

        return endpoint

    def not_found(self, request: Request, what: str) -> Response:
        return self.page(request, 'error.html', 404, title='Not found', message=what)

    async def runs(self, request: Request) -> Response:
        params = request.query_params
        status = params.get('status') or None
        if status is not None and status not in RUN_STATUSES:
            raise _BadRequest(f'status must be one of {", ".join(sorted(RUN_STATUSES))}')
        filters = queries.RunFilters(
            status=status, agent=params.get('agent'), conversation=params.get('conversation'), text=params.get('q')
        )
        page = await queries.runs_page(
            self.store,
            filters,
            start=_number(request, 'start', 0),
            size=_number(request, 'size', queries.PAGE_SIZE),
        )
        return self.page(request, 'runs.html', filters=filters, page=page, statuses=sorted(RUN_STATUSES))

    async def run(self, request: Request) -> Response:
        run_id = _text(request, 'id')
        detail = await queries.run_detail(self.store, run_id)
        if detail is None:
            return self.not_found(request, f'No run {run_id!r} is stored.')
        return self.page(request, 'run.html', run=detail, refresh_ms=self.refresh_ms)

    async def run_state(self, request: Request) -> Response:
        state = await queries.run_state(self.store, _text(request, 'id'))
        if state is None:
            return JSONResponse({'error': 'no such run'}, status_code=404)
        return JSONResponse(
            {
                'status': state.status,
                'events': state.events,
                'unresolved': state.unresolved,
                'fingerprint': state.fingerprint,
            }
        )

    async def messages(self, request: Request) -> Response:
        run_id, seq = _text(request, 'id'), _number(request, 'seq')
        snapshot = await queries.find_snapshot(self.store, run_id, seq)
        if snapshot is None:
            return self.not_found(request, f'Run {run_id!r} has no retained snapshot {seq}.')
        return self.page(request, 'messages.html', snapshot=snapshot, messages=message_views(snapshot.messages))

    async def media(self, request: Request) -> Response:
        from pydantic_ai.messages import ModelMessagesTypeAdapter

        run_id, seq, digest = _text(request, 'run'), _number(request, 'seq'), _text(request, 'digest')
        if not is_digest(digest):
            raise _BadRequest('digest must be 64 lowercase hexadecimal characters')
        snapshot = await queries.find_snapshot(self.store, run_id, seq)
        blob = None if snapshot is None else find_blob(ModelMessagesTypeAdapter.dump_python(snapshot.messages), digest)
        if blob is None:
            return self.not_found(request, f'Snapshot {seq} of run {run_id!r} holds no blob {digest}.')
        disposition = 'inline' if blob.inline else f'attachment; filename="{digest[:16]}"'
        return Response(
            blob.data,
            headers={
                'Content-Type': blob.media_type,
                'Content-Disposition': disposition,
                'Content-Security-Policy': MEDIA_CONTENT_SECURITY_POLICY,
                'Cache-Control': 'private, max-age=3600',
            },
        )

    async def conversations(self, request: Request) -> Response:
        page = await queries.conversations_page(
            self.store, start=_number(request, 'start', 0), size=_number(request, 'size', queries.PAGE_SIZE)
        )
        return self.page(request, 'conversations.html', page=page)

    async def conversation(self, request: Request) -> Response:
        conversation_id = _text(request, 'id')
        detail = await queries.conversation_detail(self.store, conversation_id)
        if detail is None:
            return self.not_found(request, f'No run belongs to conversation {conversation_id!r}.')
        return self.page(request, 'conversation.html', conversation=detail, max_runs=queries.MAX_CONVERSATION_RUNS)


def create_app(
    store: StepStore,
    *,
    store_url: str | None = None,
    token: str | None = None,
    allowed_hosts: Collection[str] | None = None,
    refresh_seconds: float = DEFAULT_REFRESH_SECONDS,
) -> Starlette:
    """The inspector over `store`, which the caller opened and closes (the application only reads it).

    `store_url`: shown in the header with its password redacted (else the store's type is).
    `token`: every request must carry it (`?token=` once, then the cookie it sets).
    `allowed_hosts`: the `Host` names accepted (`None`: any; `step-persistence serve` passes the
    loopback names when it binds to loopback). `refresh_seconds`: how often a page of a run that
    has not ended checks for changes. `TypeError`/`ValueError` for arguments of the wrong kind.
    """
    if not isinstance(store, StepStore):
        raise TypeError(f'store must be a StepStore, not {type(store).__name__}')
    if store_url is not None and not isinstance(store_url, str):
        raise TypeError(f'store_url must be a string or None, not {type(store_url).__name__}')
    if token is not None and not isinstance(token, str):
        raise TypeError(f'token must be a string or None, not {type(token).__name__}')
    if token == '':
        raise ValueError('token must not be empty (None: no token)')
    if allowed_hosts is not None and (
        isinstance(allowed_hosts, str) or not all(isinstance(host, str) for host in allowed_hosts)
    ):
        raise TypeError('allowed_hosts must be a collection of host names (strings), or None')
    if not isinstance(refresh_seconds, int | float) or isinstance(refresh_seconds, bool) or refresh_seconds <= 0:
        raise ValueError(f'refresh_seconds must be a positive number, not {refresh_seconds!r}')
    label = redact_url(store_url) if store_url is not None else type(store).__name__
    inspector = _Inspector(store, label, refresh_seconds)
    routes: list[Route | Mount] = [
        Route(path, inspector.guarded(handler), methods=['GET'])
        for path, handler in (
            ('/', inspector.runs),
            ('/run', inspector.run),
            ('/run/state', inspector.run_state),
            ('/run/messages', inspector.messages),
            ('/media', inspector.media),
            ('/conversations', inspector.conversations),
            ('/conversation', inspector.conversation),
        )
    ]
    routes.append(Mount('/static', StaticFiles(packages=[('step_persistence.inspector', 'static')]), name='static'))

    async def not_found(request: Request, error: Exception) -> Response:
        return inspector.not_found(request, f'No page at {request.url.path}.')

    return Starlette(
        routes=routes,
        middleware=[Middleware(Guard, token=token, allowed_hosts=allowed_hosts)],
        exception_handlers={404: not_found},
    )
