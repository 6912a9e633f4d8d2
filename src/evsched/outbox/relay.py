"""The relay: committed outbox rows to the events topic, in id order, deleted once acknowledged.

Replicas: every relay takes the table's session-level advisory lock with
``pg_try_advisory_lock``; the one that holds it relays, the others stand by and retry each poll.
An advisory lock rather than ``SELECT … FOR UPDATE SKIP LOCKED`` because one relay at a time keeps
the rows' order on the way to Kafka (two relays sharing rows would race two batches to the broker,
so an earlier row of a job could land after a later one), and one relay moves more rows a second
than the targets ask (docs/benchmarks.md). PostgreSQL frees the lock when the holder's session
ends, so a killed relay's standby takes over within a poll.

Exactly once as evsched sees it: a row is deleted only after the broker acknowledged its event;
a relay killed in between sends the row again, and the fold calls the copy ``duplicate`` (same
event id and body, ``core/fold.py``). The relay wakes on ``LISTEN`` and also polls, since a
notification sent while no relay listened is lost.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg
import structlog

from evsched.adapters.clock import monotonic_s
from evsched.errors import BrokerUnavailable, PublishError
from evsched.metrics import RelayInstruments
from evsched.outbox.table import DEFAULT_TABLE, OutboxTable
from evsched.ports import Appended, EventLog, Outbound

log = structlog.get_logger("evsched.relay")

# How often the backlog gauges are refreshed while rows keep coming (a count(*) each time).
BACKLOG_EVERY_S = 1.0


@dataclass(frozen=True, slots=True, kw_only=True)
class RelayConfig:
    dsn: str
    table: str = DEFAULT_TABLE
    batch_size: int = 500
    poll_s: float = 1.0  # polls this often without a notification; standbys try the lock so
    retry_s: float = 1.0  # after a batch the broker or the database did not take


class Relay:
    """Moves one outbox table's rows to ``topic`` through EventLogs made by ``log_factory``."""

    def __init__(
        self,
        config: RelayConfig,
        log_factory: Callable[[], EventLog],
        topic: str,
        instruments: RelayInstruments | None = None,
    ) -> None:
        self.config = config
        self.table = OutboxTable(config.table)
        self.topic = topic
        self.instruments = instruments if instruments is not None else RelayInstruments()
        self._log_factory = log_factory
        self._log: EventLog | None = None
        self._backlog_at = 0.0
        self.leading = False

    async def run(self, stop: asyncio.Event) -> None:
        """Relay until ``stop`` is set; reconnects to the database when it goes away."""
        try:
            while not stop.is_set():
                try:
                    async with await psycopg.AsyncConnection.connect(
                        self.config.dsn, autocommit=True
                    ) as conn:
                        await self._serve(conn, stop)
                except psycopg.Error as exc:
                    # Unreachable, restarted, or the table not made yet (evsched outbox init):
                    # the same wait, then a new session.
                    self._lead(False)
                    self.instruments.failures.labels("database").inc()
                    log.warning(
                        "outbox_database_unavailable",
                        error=" ".join(str(exc).split())[:300],
                        table=self.config.table,
                    )
                    await _pause(stop, self.config.retry_s)
        finally:
            await self._drop_log()

    async def _serve(self, conn: psycopg.AsyncConnection[Any], stop: asyncio.Event) -> None:
        await conn.execute(self.table.sql("listen"))
        while not stop.is_set() and not await self._try_lock(conn):
            await self._report_backlog(conn, force=True)
            await _pause(stop, self.config.poll_s)
        if stop.is_set():
            return
        self._lead(True)
        try:
            while not stop.is_set():
                await self.drain(conn, stop)
                await self._report_backlog(conn)  # at most once a second: a count(*)
                await self._wait_for_rows(conn)
        finally:
            self._lead(False)

    async def drain(self, conn: psycopg.AsyncConnection[Any], stop: asyncio.Event) -> int:
        """Relay batches until a batch comes back short; how many rows were relayed."""
        total = 0
        while not stop.is_set():
            try:
                moved, full = await self.relay_batch(conn)
            except (PublishError, BrokerUnavailable) as exc:
                self.instruments.failures.labels("broker").inc()
                log.warning("outbox_relay_unacknowledged", error=str(exc)[:300])
                await self._drop_log()  # a producer stuck after an outage is made anew
                await self._report_backlog(conn)
                await _pause(stop, self.config.retry_s)
                continue
            total += moved
            await self._report_backlog(conn)
            if not full:
                break
        return total

    async def relay_batch(self, conn: psycopg.AsyncConnection[Any]) -> tuple[int, bool]:
        """The oldest rows to the topic; deletes those acknowledged. (rows moved, batch full).

        Raises PublishError when any row was not acknowledged (the acknowledged ones are gone).
        """
        cursor = await conn.execute(
            self.table.sql("oldest"), {"limit": self.config.batch_size}, binary=True
        )
        rows = await cursor.fetchall()
        if not rows:
            return 0, False
        records = [Outbound(key=job_id, value=bytes(event)) for _, job_id, event in rows]
        results = await (await self._event_log()).append_many(self.topic, records)
        acked = [
            row[0]
            for row, result in zip(rows, results, strict=True)
            if isinstance(result, Appended)
        ]
        if acked:
            deleted = await conn.execute(self.table.sql("delete"), {"ids": acked})
            self.instruments.relayed_rows(age for (age,) in await deleted.fetchall())
        refused = [r for r in results if isinstance(r, PublishError)]
        if refused:
            raise PublishError(
                f"{len(refused)} of {len(rows)} rows not acknowledged; first: {refused[0]}"
            )
        return len(acked), len(rows) == self.config.batch_size

    async def _wait_for_rows(self, conn: psycopg.AsyncConnection[Any]) -> None:
        # Woken by a commit's NOTIFY, or after poll_s in any case (a lost notification).
        async for _ in conn.notifies(timeout=self.config.poll_s, stop_after=1):
            pass

    async def _try_lock(self, conn: psycopg.AsyncConnection[Any]) -> bool:
        cursor = await conn.execute(self.table.sql("try_lock"), {"key": self.table.lock_key})
        found = await cursor.fetchone()
        return bool(found and found[0])

    async def _report_backlog(
        self, conn: psycopg.AsyncConnection[Any], *, force: bool = False
    ) -> None:
        now = monotonic_s()
        if not force and now - self._backlog_at < BACKLOG_EVERY_S:
            return
        self._backlog_at = now
        cursor = await conn.execute(self.table.sql("backlog"))
        found = await cursor.fetchone()
        if found is not None:
            self.instruments.backlog(int(found[0]), float(found[1]))

    def _lead(self, leading: bool) -> None:
        if leading != self.leading:
            log.info("outbox_relay_leading" if leading else "outbox_relay_standing_by")
        self.leading = leading
        self.instruments.leader.set(1 if leading else 0)

    async def _event_log(self) -> EventLog:
        if self._log is None:
            made = self._log_factory()
            await made.start()
            self._log = made
        return self._log

    async def _drop_log(self) -> None:
        made, self._log = self._log, None
        if made is not None:
            with contextlib.suppress(Exception):
                await made.close()


async def _pause(stop: asyncio.Event, seconds: float) -> None:
    """Sleep ``seconds``, or less when ``stop`` is set meanwhile."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), timeout=seconds)
