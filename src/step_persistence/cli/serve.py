"""`step-persistence serve`: the read-only web inspector over a store (the `inspector` extra).

The store is opened as every reading command opens it (`_common.open_store`: nothing is created or
migrated) and stays open while the server runs. The bind is checked before anything is imported or
opened (`inspector.binding`): loopback only, unless `--allow-remote` and a `--token` are given.
Starlette and uvicorn are imported when the command runs, never at the command line's start-up.
"""

from __future__ import annotations

import socket
import sys
from typing import TYPE_CHECKING, Annotated, Any

import typer

from step_persistence._urls import redact_url
from step_persistence.cli._common import (
    DEFAULT_STORE,
    EXIT_FAILED,
    EXIT_USAGE,
    StoreOption,
    fail,
    open_store,
    run,
)

if TYPE_CHECKING:
    from starlette.applications import Starlette

__all__ = ['TOKEN_ENV', 'serve']

TOKEN_ENV = 'STEP_PERSISTENCE_INSPECTOR_TOKEN'
"""Where `--token` may come from instead, so that it stays out of the process list."""


def _listening_socket(host: str, port: int) -> socket.socket:
    """A socket bound to `host:port` (`0`: a free port), or exit saying why it cannot be."""
    family = socket.AF_INET6 if ':' in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host.strip('[]'), port))
    except OSError as error:
        sock.close()
        fail(f'cannot listen on {host}:{port}: {error.strerror or error}', EXIT_FAILED)
    return sock


def _address(sock: socket.socket, token: str | None) -> str:
    """The URL the server answers at (with the token to present once, when there is one)."""
    host, port = sock.getsockname()[:2]
    shown = f'[{host}]' if ':' in host else host
    return f'http://{shown}:{port}/' + ('' if token is None else f'?token={token}')


async def _serve(app: Starlette, sock: socket.socket, *, address: str, open_browser: bool, store_label: str) -> None:
    """Run uvicorn on `sock` until it is stopped, announcing `address` on stdout once it listens."""
    import uvicorn

    class Server(uvicorn.Server):
        """uvicorn's server, saying where it listens once it does."""

        async def startup(self, sockets: Any = None) -> None:
            await super().startup(sockets=sockets)
            if self.started:
                sys.stdout.write(f'Inspecting {store_label} (read-only) at {address}\nPress Ctrl-C to stop.\n')
                sys.stdout.flush()
                if open_browser:
                    import webbrowser

                    webbrowser.open(address)

    config = uvicorn.Config(app, log_level='warning', lifespan='off', access_log=False, server_header=False)
    await Server(config).serve(sockets=[sock])


def serve(
    store: StoreOption = DEFAULT_STORE,
    host: Annotated[
        str,
        typer.Option(
            metavar='HOST', help='Address to listen on. Anything but loopback needs --allow-remote and --token.'
        ),
    ] = '127.0.0.1',
    port: Annotated[
        int, typer.Option(metavar='PORT', min=0, max=65535, help='Port to listen on (0: any free one).')
    ] = 8765,
    open_browser: Annotated[bool, typer.Option('--open', help='Open the inspector in the default browser.')] = False,
    allow_remote: Annotated[
        bool, typer.Option('--allow-remote', help='Allow a --host other than loopback (needs --token).')
    ] = False,
    token: Annotated[
        str | None,
        typer.Option(
            metavar='TOKEN',
            envvar=TOKEN_ENV,
            help=(
                'A secret (16 characters or more) every request must carry: ?token= once, then a cookie. '
                f'Also {TOKEN_ENV}.'
            ),
            show_default=False,
        ),
    ] = None,
) -> None:
    """Serve a read-only web inspector of the store: runs, lineage, timelines, ledgers, messages."""
    from step_persistence.inspector.binding import LOOPBACK_HOST_HEADERS, BindRefused, check_bind, is_loopback

    try:
        check_bind(host, allow_remote=allow_remote, token=token)
    except BindRefused as error:
        fail(str(error), EXIT_USAGE)
    try:
        import uvicorn  # noqa: F401  (checked here, so a missing extra is said before the store is opened)

        from step_persistence.inspector import create_app
    except ImportError as error:
        fail(f"{error}; `serve` needs the 'inspector' extra: pip install 'step-persistence[inspector]'", EXIT_USAGE)
    sock = _listening_socket(host, port)

    async def main() -> None:
        async with open_store(store) as opened:
            app = create_app(
                opened,
                store_url=store,
                token=token,
                allowed_hosts=[*LOOPBACK_HOST_HEADERS, host] if is_loopback(host) else None,
            )
            await _serve(
                app, sock, address=_address(sock, token), open_browser=open_browser, store_label=redact_url(store)
            )

    try:
        run(main)
    except KeyboardInterrupt:
        pass
    finally:
        sock.close()
