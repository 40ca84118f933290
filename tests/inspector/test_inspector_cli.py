"""`step-persistence serve` as a user runs it: the installed console script, a real socket, a real store.

A non-loopback bind is refused before anything is opened, and served with `--allow-remote` and a
token; every backend is served; a served store never shows the password of its URL; the token is
asked for; Ctrl-C stops the server cleanly; without the `inspector` extra the command says how to
install it.
"""

from __future__ import annotations

import http.client
import os
import select
import shlex
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from pydantic_ai import Agent

from step_persistence import PostgresStepStore, StepPersistence, from_spec
from step_persistence.cli.serve import TOKEN_ENV
from support.console_script import SCRIPT, cli
from support.mongo_helpers import scratch
from support.scripted import calls, scripted, text
from support.servers import wait_until
from support.servers.mongo import MongoServer, Scratch
from support.servers.postgres import PostgresServer

__all__ = ['scratch']

pytestmark = pytest.mark.anyio

TOKEN = 'correct-horse-battery-staple'
EXIT_USAGE = 2
EXIT_UNREACHABLE = 4
PASSWORD = 'hunter2-not-shown'


@pytest.mark.parametrize(
    ('options', 'said'),
    [
        (['--host', '0.0.0.0'], '--allow-remote'),
        (['--host', '192.168.1.20', '--token', TOKEN], '--allow-remote'),
        (['--host', '0.0.0.0', '--allow-remote'], 'without a token'),
        (['--host', '0.0.0.0', '--allow-remote', '--token', 'short'], 'at least 16 characters'),
    ],
    ids=['no-allow-remote', 'token-alone', 'no-token', 'short-token'],
)
def test_a_non_local_bind_without_allow_remote_and_a_token_is_refused(
    options: list[str], said: str, tmp_path: Path
) -> None:
    store = tmp_path / 'runs.db'
    refused = cli('serve', '--store', f'sqlite:///{store}', '--port', '0', *options, expect=EXIT_USAGE)
    assert said in refused.stderr
    assert refused.stdout == '', 'nothing was served'
    assert not store.exists()


def test_a_store_that_does_not_exist_is_refused_and_not_created(tmp_path: Path) -> None:
    store = tmp_path / 'missing.db'
    refused = cli('serve', '--store', f'sqlite:///{store}', '--port', '0', expect=EXIT_UNREACHABLE)
    assert 'no SQLite database' in refused.stderr
    assert not store.exists()


def test_a_port_in_use_is_said_before_the_store_is_read(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(('127.0.0.1', 0))
        taken.listen()
        port = taken.getsockname()[1]
        refused = cli('serve', '--store', f'sqlite:///{tmp_path / "missing.db"}', '--port', str(port), expect=1)
    assert f'cannot listen on 127.0.0.1:{port}' in refused.stderr


@contextmanager
def served(*args: str, env: dict[str, str] | None = None) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """`step-persistence serve ARGS --port 0` running; yields the line it printed and the process."""
    process = subprocess.Popen(
        [str(SCRIPT), 'serve', '--port', '0', *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=None if env is None else {**os.environ, **env},
    )
    assert process.stdout is not None
    try:
        ready, _, _ = select.select([process.stdout], [], [], 60)
        assert ready, 'serve printed no address within 60 s'
        line = process.stdout.readline()
        assert ' at http://' in line, (line, process.poll())
        yield line, process
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def fetch(address: str, path: str, cookie: str | None = None) -> tuple[http.client.HTTPResponse, str]:
    """GET `path` from the server at `address`: the response and its body."""
    parts = urlsplit(address)
    connection = http.client.HTTPConnection(parts.hostname or '', parts.port, timeout=30)
    connection.request('GET', path, headers={'Cookie': cookie} if cookie else {})
    response = connection.getresponse()
    return response, response.read().decode()


def page(address: str, path: str, cookie: str | None = None) -> str:
    response, text = fetch(address, path, cookie)
    assert response.status == 200, (path, response.status, text[:300])
    return text


async def _write_runs(url: str) -> None:
    async with from_spec(url) as store:
        agent = Agent(
            scripted(calls(('lookup', {'q': 'x'}, 'lookup-1')), text('done')),
            capabilities=[StepPersistence(store=store, agent_name='served', run_id='served-run')],
        )

        @agent.tool_plain
        async def lookup(q: str) -> str:
            return f'found {q}'

        await agent.run('look it up', conversation_id='served-conversation')


async def test_serve_asks_for_its_token_then_serves_the_store_until_ctrl_c(tmp_path: Path) -> None:
    url = f'sqlite:///{tmp_path / "runs.db"}'
    await _write_runs(url)
    with served('--store', url, '--token', TOKEN) as (line, process):
        address = line.split(' at ', 1)[1].split()[0]
        assert address.endswith(f'/?token={TOKEN}') and address.startswith('http://127.0.0.1:')
        assert fetch(address, '/')[0].status == 401
        entry, _ = fetch(address, f'/?token={TOKEN}')
        assert entry.status == 303
        cookie = (entry.getheader('set-cookie') or '').split(';', 1)[0]
        assert 'served-run' in page(address, '/', cookie)
        assert 'lookup-1' in page(address, '/run?id=served-run', cookie)
        assert fetch(address, '/', cookie)[0].getheader('content-security-policy')
        process.send_signal(signal.SIGINT)
        assert process.wait(30) == 0
    assert process.stderr is not None and 'Traceback' not in process.stderr.read()


async def test_open_starts_the_browser_on_the_address_once_it_listens(tmp_path: Path) -> None:
    url = f'sqlite:///{tmp_path / "runs.db"}'
    await _write_runs(url)
    opened = tmp_path / 'opened.txt'
    record = f'import sys; open({str(opened)!r}, "w").write(sys.argv[1])'
    browser = f'{shlex.quote(sys.executable)} -c {shlex.quote(record)} %s'  # webbrowser runs $BROWSER
    with served('--store', url, '--open', env={'BROWSER': browser}) as (line, _):
        address = line.split(' at ', 1)[1].split()[0]
        wait_until(lambda: opened.exists() and opened.read_text() == address, timeout=30, what='the browser')
        assert 'served-run' in page(address, '/')


async def test_no_page_shows_the_password_of_the_store_url(postgres_server: PostgresServer) -> None:
    database = await postgres_server.create_database()
    plain = postgres_server.url(database).replace('+asyncpg', '')
    store = PostgresStepStore(plain)
    await store.migrate()
    await store.aclose()
    with_password = plain.replace('postgres@', f'postgres:{PASSWORD}@')  # the test cluster trusts local connections
    await _write_runs(with_password)
    with served('--store', with_password) as (line, _):
        assert PASSWORD not in line and 'postgres:***@' in line
        address = line.split(' at ', 1)[1].split()[0]
        pages = [
            page(address, path)
            for path in (
                '/',
                '/run?id=served-run',
                '/run/messages?id=served-run&seq=1',
                '/conversations',
                '/conversation?id=served-conversation',
            )
        ]
        assert 'served-run' in pages[0] and 'postgres:***@' in pages[0]
        assert not [shown for shown in pages if PASSWORD in shown]
    await postgres_server.drop_database(database)


@pytest.mark.parametrize('backend', ['sqlite', 'file', 'mongodb'])
async def test_serve_serves_every_backend(
    backend: str, tmp_path: Path, mongo_server: MongoServer, scratch: Scratch
) -> None:
    """PostgreSQL is served by `test_no_page_shows_the_password_of_the_store_url`."""
    url = {
        'sqlite': f'sqlite:///{tmp_path / "runs.db"}',
        'file': f'file://{tmp_path / "runs"}',
        'mongodb': mongo_server.uri_for(scratch.fresh_database()),
    }[backend]
    await _write_runs(url)
    with served('--store', url) as (line, _):
        address = line.split(' at ', 1)[1].split()[0]
        assert 'served-run' in page(address, '/')
        assert 'lookup-1' in page(address, '/run?id=served-run')
        assert 'look it up' in page(address, '/run/messages?id=served-run&seq=1')
        assert 'served-run' in page(address, '/conversation?id=served-conversation')


async def test_a_remote_bind_with_allow_remote_and_a_token_serves_only_who_has_the_token(tmp_path: Path) -> None:
    url = f'sqlite:///{tmp_path / "runs.db"}'
    await _write_runs(url)
    with served('--store', url, '--host', '0.0.0.0', '--allow-remote', env={TOKEN_ENV: TOKEN}) as (line, _):
        address = line.split(' at ', 1)[1].split()[0]
        assert address.startswith('http://0.0.0.0:') and address.endswith(f'/?token={TOKEN}')
        reachable = address.replace('0.0.0.0', '127.0.0.1')
        assert fetch(reachable, '/')[0].status == 401
        assert fetch(reachable, '/?token=not-the-token-at-all')[0].status == 401
        entry, _ = fetch(reachable, f'/?token={TOKEN}')
        assert entry.status == 303 and entry.getheader('location') == '/'
        cookie = (entry.getheader('set-cookie') or '').split(';', 1)[0]
        assert TOKEN not in cookie
        assert 'served-run' in page(reachable, '/', cookie)
        other_host = http.client.HTTPConnection('127.0.0.1', urlsplit(reachable).port, timeout=30)
        other_host.request('GET', '/', headers={'Cookie': cookie, 'Host': 'inspector.example:8765'})
        assert other_host.getresponse().status == 200, 'a remote bind serves any Host name (the token guards it)'


WITHOUT_THE_EXTRA = """
import sys
from importlib.abc import MetaPathFinder


class NotInstalled(MetaPathFinder):
    # finds the extra's packages as Python does when they are not installed

    def find_spec(self, name, path, target=None):
        if name.partition('.')[0] in ('starlette', 'uvicorn', 'jinja2'):
            raise ModuleNotFoundError(f'No module named {name!r}', name=name)
        return None


sys.meta_path.insert(0, NotInstalled())
import step_persistence.inspector.binding  # the standard library only: serve checks the bind first

try:
    from step_persistence.inspector import create_app
except ImportError as error:
    assert "pip install 'step-persistence[inspector]'" in str(error), error
else:
    raise AssertionError('the inspector imported without its extra')
from step_persistence.cli import main
sys.argv = ['step-persistence', 'serve', '--store', sys.argv[1], '--port', '0']
main()
"""


def test_without_the_inspector_extra_serve_says_how_to_install_it(tmp_path: Path) -> None:
    store = tmp_path / 'runs.db'
    completed = subprocess.run(
        [sys.executable, '-c', WITHOUT_THE_EXTRA, f'sqlite:///{store}'], capture_output=True, text=True, timeout=120
    )
    assert completed.returncode == EXIT_USAGE, (completed.stdout, completed.stderr)
    assert "pip install 'step-persistence[inspector]'" in completed.stderr
    assert completed.stdout == '' and not store.exists()
