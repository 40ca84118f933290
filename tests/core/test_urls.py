"""One URL redactor and one scheme parser for every message, log line and repr."""

from __future__ import annotations

import pytest

from step_persistence._urls import redact_text, redact_url, url_scheme

SECRET = 'Wr/ong?Se#cret@8'


@pytest.mark.parametrize(
    ('url', 'shown'),
    [
        ('postgresql://scott:tiger@db:5432/x', 'postgresql://scott:***@db:5432/x'),
        ('mongodb+srv://u:p%40ss@cluster/db?x=1', 'mongodb+srv://u:***@cluster/db?x=1'),
        ('sqlite:///runs.db', 'sqlite:///runs.db'),
        ('postgresql://app:Wr/ongSecret8@host/db?command_timeout=x', 'postgresql://app:***@host/db?command_timeout=x'),
        ('postgresql://u@h/d?password=abc&sslmode=require', 'postgresql://u@h/d?password=***&sslmode=require'),
        ('MONGODB://admin:MongoSecret3@h/db', 'MONGODB://admin:***@h/db'),
        ('postgresql://u@h/d?sslpassword=k&PGPASSWORD=j', 'postgresql://u@h/d?sslpassword=***&PGPASSWORD=***'),
        ('file:///tmp/runs', 'file:///tmp/runs'),
        ('postgresql://a:Mongo Secret3@h/db', 'postgresql://a:***@h/db'),
        ('not a url', 'not a url'),
    ],
)
def test_passwords_are_hidden_and_the_rest_kept(url: str, shown: str) -> None:
    assert redact_url(url) == shown


def test_a_password_holding_url_delimiters_is_hidden_whole() -> None:
    shown = redact_url(f'postgresql://app:{SECRET}@host/db?x=1')
    assert not any(piece in shown for piece in ('Wr', 'ong', 'Se', 'cret'))
    assert shown.startswith('postgresql://app:***@')


def test_every_url_in_a_text_is_redacted() -> None:
    text = "cannot reach 'postgresql://a:b1@h/d' nor mongodb://c:d2@m/x; sqlite:///ok.db is fine"
    assert redact_text(text) == "cannot reach 'postgresql://a:***@h/d' nor mongodb://c:***@m/x; sqlite:///ok.db is fine"


@pytest.mark.parametrize(
    ('url', 'scheme'),
    [
        ('POSTGRESQL+asyncpg://h/d', 'postgresql'),
        ('mongodb+srv://h/d', 'mongodb'),
        ('sqlite://', 'sqlite'),
        ('memory', None),
        ('/some/path', None),
    ],
)
def test_the_scheme_is_the_lower_cased_backend_part(url: str, scheme: str | None) -> None:
    assert url_scheme(url) == scheme
