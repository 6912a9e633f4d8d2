"""Enqueue in the caller's transaction: the job's encoded ``JobEnqueued`` goes into the outbox.

The event is built and encoded by the client's own path (``TaskOptions.build``, then
``encode_checked``), so the row holds exactly the bytes ``App.enqueue`` would have sent, with the
job id and event id fixed at insert: the relay may send them twice after a crash and the fold
calls the second copy a ``duplicate``. Nothing reaches Kafka unless the transaction commits.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg
from sqlalchemy import text
from sqlalchemy.engine import Connection as SaConnection
from sqlalchemy.ext.asyncio import AsyncConnection as SaAsyncConnection
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

from evsched.client.task import EnqueueCall
from evsched.commands import encode_checked
from evsched.core.events import JobEnqueued, entity_id
from evsched.errors import InvalidEnqueue
from evsched.outbox.table import DEFAULT_TABLE, OutboxTable

# What ``enqueue`` takes: psycopg's async connection, or SQLAlchemy's async session/connection.
AsyncTarget = psycopg.AsyncConnection[Any] | AsyncSession | SaAsyncConnection
# What ``enqueue_sync`` takes: psycopg's connection, or SQLAlchemy's session/connection.
SyncTarget = psycopg.Connection[Any] | Session | SaConnection


@dataclass(frozen=True, slots=True)
class OutboxEntry:
    """What an outbox enqueue wrote: the job's id and the exact bytes the relay will send."""

    job_id: str
    key: str  # the Kafka key: the job id, as App.enqueue keys it
    event: bytes
    enqueued: JobEnqueued


class Outbox:
    """``await outbox.enqueue(conn, task.call(...), key=...)`` inside your transaction.

    ``key`` is the idempotency key (the job id derives from it and the queue); without one the
    job gets a fresh id, still fixed in the row. Workflow steps (``after=``) are refused: their
    registrations must be written atomically with them, which ``App.enqueue_workflow`` does.
    """

    def __init__(self, table: str = DEFAULT_TABLE) -> None:
        self.table = OutboxTable(table)

    def entry(self, call: EnqueueCall, *, key: str | None = None) -> OutboxEntry:
        """The row for ``call``: built and encoded as the client would; InvalidEnqueue else."""
        options = call.options if key is None else call.options.options(idempotency_key=key)
        app = options.task.app
        event = options.traced().build(call.args, call.kwargs, app.clock.now_ms())
        if event.after:
            raise InvalidEnqueue("after", "workflow steps cannot go through the outbox")
        data = encode_checked(event)
        return OutboxEntry(job_id=event.job_id, key=entity_id(event), event=data, enqueued=event)

    async def enqueue(
        self, conn: AsyncTarget, call: EnqueueCall, *, key: str | None = None
    ) -> OutboxEntry:
        """Insert ``call``'s job into the outbox in ``conn``'s current transaction."""
        entry = self.entry(call, key=key)
        params = {"job_id": entry.key, "event": entry.event}
        if isinstance(conn, psycopg.AsyncConnection):
            await conn.execute(self.table.sql("insert"), params)
        elif isinstance(conn, AsyncSession | SaAsyncConnection):
            await conn.execute(text(self.table.sql_named("insert")), params)
        else:
            raise TypeError(_unsupported(conn, "enqueue_sync"))
        return entry

    def enqueue_sync(
        self, conn: SyncTarget, call: EnqueueCall, *, key: str | None = None
    ) -> OutboxEntry:
        """``enqueue`` for sync code: psycopg's Connection, SQLAlchemy's Session or Connection."""
        entry = self.entry(call, key=key)
        params = {"job_id": entry.key, "event": entry.event}
        if isinstance(conn, psycopg.Connection):
            conn.execute(self.table.sql("insert"), params)
        elif isinstance(conn, Session | SaConnection):
            conn.execute(text(self.table.sql_named("insert")), params)
        else:
            raise TypeError(_unsupported(conn, "enqueue"))
        return entry


def _unsupported(conn: object, other: str) -> str:
    return (
        f"{type(conn).__qualname__} is not a connection the outbox writes through (psycopg 3 or "
        f"SQLAlchemy 2, async for enqueue, sync for enqueue_sync); or did you mean {other}?"
    )
