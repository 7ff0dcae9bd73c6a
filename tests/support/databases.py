"""Databases of the embedded PostgreSQL for tests: a migrated template, and a fresh copy of it for
each test module that runs a worker (a worker takes every job in its database, so a module with a
worker must not share the database, and its queue, with the rest of the suite)."""

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg import sql

from app.core.migrate import upgrade

TEMPLATE_DATABASE = "contextd_template"


def database_url(base_url: str, name: str) -> str:
    """`base_url` (a `postgresql://` URL of the embedded server) naming another database."""
    parts = urlsplit(base_url)
    return urlunsplit(parts._replace(path=f"/{name}"))


def _admin(base_url: str, statement: sql.Composable) -> None:
    with psycopg.connect(base_url, autocommit=True) as conn:
        conn.execute(statement)


def create_template(base_url: str) -> None:
    """A migrated database nobody connects to, so that it can be copied."""
    _admin(base_url, sql.SQL("CREATE DATABASE {}").format(sql.Identifier(TEMPLATE_DATABASE)))
    upgrade(database_url(base_url, TEMPLATE_DATABASE))


@contextmanager
def fresh_database(base_url: str) -> Iterator[str]:
    """A new database copied from the template (schema and job tables, no rows); dropped after."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    _admin(
        base_url,
        sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
            sql.Identifier(name), sql.Identifier(TEMPLATE_DATABASE)
        ),
    )
    try:
        yield database_url(base_url, name)
    finally:
        _admin(base_url, sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(name)))
