"""Creating the outbox table (``evsched outbox init``): idempotent, and safe to run concurrently."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

from evsched.errors import EvschedError
from evsched.outbox.table import DEFAULT_TABLE, OutboxTable


class OutboxDatabaseError(EvschedError):
    """The database could not be reached or refused a statement; the message says which."""


@dataclass(frozen=True, slots=True)
class Backlog:
    rows: int
    oldest_s: float


def init_table_sync(dsn: str, table: str = DEFAULT_TABLE) -> None:
    """Create the table, its NOTIFY trigger and function if missing (one transaction)."""
    outbox = OutboxTable(table)
    try:
        with psycopg.connect(dsn) as conn, conn.transaction():
            # Two inits at once would race CREATE ... IF NOT EXISTS on the catalog: serialize them.
            conn.execute(outbox.sql("init_lock"), {"key": outbox.lock_key + ".init"})
            conn.execute(outbox.create())
    except psycopg.Error as exc:
        raise OutboxDatabaseError(_one_line(exc)) from exc


async def init_table(
    conn: psycopg.AsyncConnection[Any] | AsyncConnection | AsyncSession,
    table: str = DEFAULT_TABLE,
) -> None:
    """``init_table_sync`` in an open async connection's current transaction (psycopg 3's, or
    SQLAlchemy 2's connection or session): beside the application's own migrations."""
    outbox = OutboxTable(table)
    key = {"key": outbox.lock_key + ".init"}
    if isinstance(conn, psycopg.AsyncConnection):
        await conn.execute(outbox.sql("init_lock"), key)
        await conn.execute(outbox.create())
    else:
        await conn.execute(text(outbox.sql_named("init_lock")), key)
        await conn.execute(text(outbox.create()))


def backlog_sync(dsn: str, table: str = DEFAULT_TABLE) -> Backlog:
    """How many rows wait in the table, and the oldest one's age."""
    outbox = OutboxTable(table)
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            found = conn.execute(outbox.sql("backlog")).fetchone()
    except psycopg.Error as exc:
        raise OutboxDatabaseError(_one_line(exc)) from exc
    assert found is not None
    return Backlog(rows=int(found[0]), oldest_s=float(found[1]))


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:400] or type(exc).__name__
