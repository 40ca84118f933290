"""Where the inspector may listen, and who may read it: the rules `step-persistence serve` checks first.

The inspector shows everything a store holds (prompts, tool arguments and results), so it binds
to the loopback interface by default. Any other address is refused unless the caller both allows
it (`--allow-remote`) and gives a token, which every request must then carry (`?token=` once,
then a cookie: see `guard.py`). This module imports only the standard library, so the command
refuses a bad bind before it imports the web stack.
"""

from __future__ import annotations

import ipaddress

__all__ = ['LOOPBACK_HOST_HEADERS', 'MIN_TOKEN_LENGTH', 'BindRefused', 'check_bind', 'is_loopback']

MIN_TOKEN_LENGTH = 16
"""A token guards a store reachable from a network: shorter ones are refused as guessable."""

LOOPBACK_HOST_HEADERS = ('127.0.0.1', 'localhost', '::1', '[::1]')
"""The `Host` names a browser sends to a loopback server; a page served on loopback refuses any other
(a DNS-rebinding page of another site arrives with its own name)."""


class BindRefused(ValueError):
    """The address or the token given to the inspector is not allowed; the message says what to change."""


def is_loopback(host: str) -> bool:
    """Whether `host` names this machine only: `localhost`, or an address of 127.0.0.0/8 or `::1`."""
    if not isinstance(host, str):
        raise TypeError(f'host must be a string, not {type(host).__name__}')
    if host.lower() == 'localhost':
        return True
    try:
        return ipaddress.ip_address(host.strip('[]')).is_loopback
    except ValueError:
        return False


def check_bind(host: str, *, allow_remote: bool, token: str | None) -> None:
    """Raise `BindRefused` unless the inspector may listen on `host` with this `token`.

    A loopback host is always allowed (a token, when given, is required of every request all the
    same). Any other host needs `allow_remote` and a token of at least `MIN_TOKEN_LENGTH`
    characters. `TypeError` for arguments of the wrong type.
    """
    if not isinstance(allow_remote, bool):
        raise TypeError(f'allow_remote must be a bool, not {type(allow_remote).__name__}')
    if token is not None and not isinstance(token, str):
        raise TypeError(f'token must be a string or None, not {type(token).__name__}')
    if token is not None and len(token) < MIN_TOKEN_LENGTH:
        raise BindRefused(f'the token must be at least {MIN_TOKEN_LENGTH} characters long')
    if is_loopback(host):
        return
    if not allow_remote:
        raise BindRefused(
            f'refusing to serve on {host!r}: it is not a loopback address, and every page shows what the store '
            'holds; pass --allow-remote with --token TOKEN to serve it on a network'
        )
    if token is None:
        raise BindRefused(f'refusing to serve on {host!r} without a token: pass --token TOKEN with --allow-remote')
