"""The PostgreSQL outbox end to end, on real PostgreSQL and the real broker (issue 36).

A job exists iff the application's transaction committed, exactly once as the fold sees it: every
claim is checked over the raw events topic, folded by the core (``outbox_rig.judge``).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import psycopg
import pytest
from sqlalchemy import create_engine
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session
from tests.conftest import TEST_EVENT_PARTITIONS, unique_name
from tests.integration.engine import wait_for
from tests.integration.outbox_rig import (
    Orders,
    commit_orders,
    fresh_table,
    judge,
    judged_once_all_there,
    outbox_app,
    rows,
    until_drained,
)

from evsched.adapters.kafka.event_log_choice import event_log_factory
from evsched.adapters.kafka.topics import Topics
from evsched.errors import PublishError
from evsched.outbox import Outbox, init_table_sync
from evsched.outbox.relay import Relay, RelayConfig
from evsched.ports import Appended, EventLog, Outbound
from evsched.settings import Settings

pytestmark = [pytest.mark.broker, pytest.mark.timeout(180)]


@pytest.fixture
def settings(kafka_bootstrap: str, namespace: str) -> Settings:
    return Settings(
        bootstrap=kafka_bootstrap, namespace=namespace, event_partitions=TEST_EVENT_PARTITIONS
    )


@pytest.fixture
def orders(postgres_dsn: str, settings: Settings, tmp_path: Path) -> Orders:
    """A fresh outbox table, the app whose jobs go in it, and relay processes of it."""
    return Orders.fresh(postgres_dsn, settings, tmp_path)


def sqlalchemy_url(dsn: str, *, driver: str = "psycopg") -> str:
    return dsn.replace("postgresql://", f"postgresql+{driver}://", 1)


@pytest.fixture
async def relay(postgres_dsn: str, settings: Settings) -> AsyncIterator[tuple[str, Relay]]:
    """An in-process relay of a fresh table, running for the test: (table, relay)."""
    table = fresh_table(postgres_dsn)
    config = RelayConfig(dsn=postgres_dsn, table=table, batch_size=100, poll_s=0.2)
    running = Relay(
        config, event_log_factory(settings, client_id="it-relay"), Topics(settings.namespace).events
    )
    stop = asyncio.Event()
    task = asyncio.create_task(running.run(stop))
    try:
        yield table, running
    finally:
        stop.set()
        await asyncio.wait_for(task, timeout=30)


async def test_rollback_enqueues_nothing_and_commit_enqueues_once_through_every_driver(
    postgres_dsn: str, settings: Settings, relay: tuple[str, Relay]
) -> None:
    table, _ = relay
    app = outbox_app(settings)
    outbox = Outbox(table)
    receipt = app.get_task("send_receipt")
    committed: list[str] = []
    rolled_back: list[str] = []

    # psycopg 3, async.
    async with await psycopg.AsyncConnection.connect(postgres_dsn) as conn:
        async with conn.transaction():
            committed.append((await outbox.enqueue(conn, receipt.call(1), key="pa-1")).job_id)
        with pytest.raises(RuntimeError):
            async with conn.transaction():
                rolled_back.append((await outbox.enqueue(conn, receipt.call(2), key="pa-2")).job_id)
                raise RuntimeError("the order insert failed")
    # psycopg 3, sync.
    with psycopg.connect(postgres_dsn) as sync_conn:
        with sync_conn.transaction():
            committed.append(outbox.enqueue_sync(sync_conn, receipt.call(3), key="ps-3").job_id)
        with sync_conn.transaction(force_rollback=True):
            rolled_back.append(outbox.enqueue_sync(sync_conn, receipt.call(4), key="ps-4").job_id)
    # SQLAlchemy 2, sync Session.
    engine = create_engine(sqlalchemy_url(postgres_dsn))
    with Session(engine) as session:
        with session.begin():
            committed.append(outbox.enqueue_sync(session, receipt.call(5), key="ss-5").job_id)
        session.begin()
        rolled_back.append(outbox.enqueue_sync(session, receipt.call(6), key="ss-6").job_id)
        session.rollback()
    engine.dispose()
    # SQLAlchemy 2, AsyncSession.
    async_engine = create_async_engine(sqlalchemy_url(postgres_dsn))
    async with AsyncSession(async_engine) as async_session:
        async with async_session.begin():
            entry = await outbox.enqueue(async_session, receipt.call(7), key="sa-7")
            committed.append(entry.job_id)
        await async_session.begin()
        rolled_back.append(
            (await outbox.enqueue(async_session, receipt.call(8), key="sa-8")).job_id
        )
        await async_session.rollback()
    await async_engine.dispose()

    await until_drained(postgres_dsn, table)
    verdicts = await wait_for(
        lambda: judged_once_all_there(settings, len(committed)), what="4 committed jobs in the log"
    )
    assert verdicts.assert_exactly_once(committed) == 0
    assert not set(rolled_back) & set(verdicts.copies)
    assert rows(postgres_dsn, table) == 0


class _CrashAfterAck:
    """An EventLog whose process 'dies' right after the broker acknowledged a batch: the rows
    were sent, and never deleted."""

    def __init__(self, real: EventLog) -> None:
        self.real = real

    async def start(self) -> None:
        await self.real.start()

    async def close(self) -> None:
        await self.real.close()

    async def append_many(
        self, topic: str, records: Sequence[Outbound]
    ) -> list[Appended | PublishError]:
        results = await self.real.append_many(topic, records)
        assert all(isinstance(r, Appended) for r in results), results
        raise _Crash


class _Crash(BaseException):
    pass


async def test_a_resend_after_a_crash_between_ack_and_delete_folds_as_duplicate(
    postgres_dsn: str, settings: Settings, orders: Orders
) -> None:
    table = orders.table
    job_ids = orders.commit([f"crash-{n}" for n in range(40)])
    topic = Topics(settings.namespace).events
    config = RelayConfig(dsn=postgres_dsn, table=table, batch_size=25, poll_s=0.2)
    real = event_log_factory(settings, client_id="it-relay")
    crashing = Relay(config, lambda: _CrashAfterAck(real()), topic)  # type: ignore[arg-type, return-value]
    async with await psycopg.AsyncConnection.connect(postgres_dsn, autocommit=True) as conn:
        with pytest.raises(_Crash):
            await crashing.drain(conn, asyncio.Event())
    await crashing._drop_log()
    assert rows(postgres_dsn, table) == 40, "a row is deleted only after its acknowledgement"

    again = Relay(config, real, topic)
    async with await psycopg.AsyncConnection.connect(postgres_dsn, autocommit=True) as conn:
        assert await again.drain(conn, asyncio.Event()) == 40
    await again._drop_log()
    assert rows(postgres_dsn, table) == 0
    verdicts = await judge(settings)
    # The first batch of 25 went twice: the fold applied each job once and called the re-sends
    # duplicates; the other 15 went once.
    assert verdicts.assert_exactly_once(job_ids) == 25
    assert sorted(verdicts.copies.values()).count(2) == 25


@pytest.mark.slow
async def test_a_relay_killed_mid_batch_and_restarted_loses_and_duplicates_nothing(
    postgres_dsn: str, settings: Settings, orders: Orders
) -> None:
    table = orders.table
    total = 1500
    job_ids = orders.commit([f"k-{n}" for n in range(total)])
    first = orders.start_relay(batch_size=20)
    try:
        await wait_for(
            lambda: asyncio.to_thread(lambda: rows(postgres_dsn, table) < total - 20),
            what="the relay under way",
        )
    finally:
        first.kill()  # SIGKILL, mid-stream: batches in flight, rows sent and not yet deleted
    left = rows(postgres_dsn, table)
    assert 0 < left < total, left
    second = orders.start_relay(batch_size=20)
    try:
        await until_drained(postgres_dsn, table, timeout_s=90)
    finally:
        second.stop()
    assert second.proc.returncode == 0, second.lines()
    verdicts = await judge(settings)
    verdicts.assert_exactly_once(job_ids)  # nothing lost, any re-send a duplicate


@pytest.mark.slow
async def test_two_relays_at_once_relay_each_row_once_and_the_standby_takes_over(
    postgres_dsn: str, settings: Settings, orders: Orders
) -> None:
    table = orders.table
    relays = [orders.start_relay(batch_size=20) for _ in range(2)]
    try:
        leading = await wait_for(
            lambda: asyncio.to_thread(
                lambda: [r for r in relays if "outbox_relay_leading" in r.lines()]
            ),
            what="a relay leading",
        )
        assert len(leading) == 1, "one relay holds the lock"
        job_ids = await asyncio.to_thread(orders.commit, [f"a-{n}" for n in range(300)])
        leader = leading[0]
        leader.kill()
        [standby] = [r for r in relays if r is not leader]
        job_ids += await asyncio.to_thread(orders.commit, [f"b-{n}" for n in range(300)])
        await until_drained(postgres_dsn, table, timeout_s=60)
        assert "outbox_relay_leading" in standby.lines()
    finally:
        for running in relays:
            running.stop()
    verdicts = await judge(settings)
    verdicts.assert_exactly_once(job_ids)


async def test_a_relay_started_before_init_waits_and_a_foreign_row_does_not_stop_it(
    postgres_dsn: str, settings: Settings
) -> None:
    table = unique_name("ob_late_")
    config = RelayConfig(dsn=postgres_dsn, table=table, batch_size=10, poll_s=0.2, retry_s=0.2)
    running = Relay(
        config, event_log_factory(settings, client_id="it-relay"), Topics(settings.namespace).events
    )
    stop = asyncio.Event()
    task = asyncio.create_task(running.run(stop))
    try:
        await wait_for(
            lambda: _failures(running, "database"), what="the relay waiting for its table"
        )
        init_table_sync(postgres_dsn, table)
        with psycopg.connect(postgres_dsn) as conn, conn.transaction():
            # Not through Outbox.enqueue: bytes that are no event, and an empty key.
            conn.execute(
                f'INSERT INTO "{table}" (job_id, event) VALUES (%s, %s), (%s, %s)',
                ("forged", b"not an avro record", "", b"\xc3\x01"),
            )
        app = outbox_app(settings)
        job_ids = commit_orders(postgres_dsn, Outbox(table), app, [f"after-{n}" for n in range(15)])
        await until_drained(postgres_dsn, table)
    finally:
        stop.set()
        await asyncio.wait_for(task, timeout=30)
    assert task.exception() is None
    verdicts = await judge(settings)
    assert verdicts.assert_exactly_once(job_ids) == 0


async def _failures(relay: Relay, cause: str) -> bool:
    return relay.instruments.failures.labels(cause)._value.get() > 0
