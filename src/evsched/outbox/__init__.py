"""Enqueue in the application's PostgreSQL transaction (a transactional outbox), and its relay.

``await Outbox().enqueue(conn, task.call(...), key=...)`` writes the job's encoded event into the
``evsched_outbox`` table in the caller's transaction (psycopg 3 or SQLAlchemy 2, async or sync);
``evsched relay --dsn ...`` sends committed rows to Kafka (docs/outbox.md). Needs the ``outbox``
extra: ``pip install 'evsched[outbox]'``.
"""

from __future__ import annotations

from evsched.outbox.schema import init_table, init_table_sync
from evsched.outbox.table import DEFAULT_TABLE, InvalidTable, OutboxTable
from evsched.outbox.writer import Outbox, OutboxEntry

__all__ = [
    "DEFAULT_TABLE",
    "InvalidTable",
    "Outbox",
    "OutboxEntry",
    "OutboxTable",
    "init_table",
    "init_table_sync",
]
