"""The outbox table in the application's PostgreSQL database: its DDL and the statements on it.

One row is one encoded ``JobEnqueued`` (the bytes a client would send) with its Kafka key, the
job id. A statement trigger ``NOTIFY``s the table's channel, which PostgreSQL delivers only when
the inserting transaction commits: a rolled-back enqueue wakes nobody and leaves nothing.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, Literal

from evsched.errors import EvschedError

DEFAULT_TABLE = "evsched_outbox"
# A plain lower-case identifier: it is spliced into SQL (quoted), and names the NOTIFY channel.
_TABLE_NAME = re.compile(r"[a-z_][a-z0-9_]{0,47}")


Statement = Literal["init_lock", "try_lock", "insert", "listen", "oldest", "delete", "backlog"]
# Every statement on an outbox table but its DDL, ``{table}`` standing for its checked name (the
# NOTIFY channel has the same name), in psycopg's parameter style.
_STATEMENTS: Final[Mapping[Statement, str]] = {
    "init_lock": "SELECT pg_advisory_xact_lock(hashtextextended(%(key)s, 0))",
    "try_lock": "SELECT pg_try_advisory_lock(hashtextextended(%(key)s, 0))",
    "insert": 'INSERT INTO "{table}" (job_id, event) VALUES (%(job_id)s, %(event)s)',
    "listen": 'LISTEN "{table}"',
    "oldest": 'SELECT id, job_id, event FROM "{table}" ORDER BY id LIMIT %(limit)s',
    # Deletes relayed rows; returns each one's age in seconds on the database's clock.
    "delete": (
        'DELETE FROM "{table}" WHERE id = ANY(%(ids)s) '
        "RETURNING extract(epoch FROM clock_timestamp() - created_at)::float8"
    ),
    # Rows waiting and the oldest one's age in seconds (0 when there are none).
    "backlog": (
        "SELECT count(*), coalesce(extract(epoch FROM clock_timestamp() - min(created_at)), 0)"
        '::float8 FROM "{table}"'
    ),
}
_PARAMETER = re.compile(r"%\((\w+)\)s")


class InvalidTable(EvschedError, ValueError):
    """A table name that is not a plain lower-case PostgreSQL identifier."""


def checked_table(name: str) -> str:
    if not isinstance(name, str) or _TABLE_NAME.fullmatch(name) is None:
        raise InvalidTable(
            f"table: {name!r} is not a lower-case identifier of at most 48 characters "
            "(letters, digits, _; not starting with a digit)"
        )
    return name


@dataclass(frozen=True, slots=True)
class OutboxTable:
    """The SQL of one outbox table; ``name`` is checked, so the strings are safe to run."""

    name: str = DEFAULT_TABLE

    def __post_init__(self) -> None:
        checked_table(self.name)

    @property
    def channel(self) -> str:
        return self.name

    @property
    def lock_key(self) -> str:
        """What the relays' advisory lock is taken on (hashed by PostgreSQL to a bigint)."""
        return f"evsched.relay.{self.name}"

    def create(self) -> str:
        """Idempotent DDL; run under ``init_lock`` so concurrent runs do not race."""
        t = self.name
        return f"""
CREATE TABLE IF NOT EXISTS "{t}" (
  id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  job_id text NOT NULL,
  event bytea NOT NULL,
  created_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE OR REPLACE FUNCTION "{t}_notify"() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_notify('{self.channel}', '');
  RETURN NULL;
END
$$;
CREATE OR REPLACE TRIGGER "{t}_notify" AFTER INSERT ON "{t}"
  FOR EACH STATEMENT EXECUTE FUNCTION "{t}_notify"();
"""

    def sql(self, statement: Statement) -> str:
        """``statement`` on this table, with psycopg's ``%(name)s`` parameters."""
        return _STATEMENTS[statement].format(table=self.name)

    def sql_named(self, statement: Statement) -> str:
        """``statement`` with ``:name`` parameters, for SQLAlchemy's ``text()``."""
        return _PARAMETER.sub(r":\1", self.sql(statement))
