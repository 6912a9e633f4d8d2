"""The outbox's test rig: relay processes, rows written through real transactions, and the events
topic read back raw and judged by the core fold (never a process's memory)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from aiokafka import TopicPartition
from tests.conftest import unique_name

from evsched.adapters import avro
from evsched.adapters.kafka import clients as kafka
from evsched.adapters.kafka.topics import Topics, partition_count
from evsched.client import App
from evsched.core.events import JobEnqueued, Position
from evsched.core.invariants import Replay, replay
from evsched.core.state import Verdict
from evsched.errors import DecodeError
from evsched.outbox import Outbox, init_table_sync
from evsched.settings import Settings

PARTITIONS = 3


def outbox_app(settings: Settings) -> App:
    app = App(settings, name=unique_name("outbox-"))

    @app.task(name="send_receipt")
    def send_receipt(order_id: int) -> None:
        """Does nothing: these tests only enqueue."""

    return app


def fresh_table(dsn: str) -> str:
    table = unique_name("ob_")
    init_table_sync(dsn, table)
    return table


def rows(dsn: str, table: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        found = conn.execute(f'SELECT count(*) FROM "{table}"').fetchone()
    assert found is not None
    return int(found[0])


def commit_orders(dsn: str, outbox: Outbox, app: App, keys: list[str]) -> list[str]:
    """One transaction per key, as an application would: the job ids written."""
    task = app.get_task("send_receipt")
    written = []
    with psycopg.connect(dsn) as conn:
        for number, key in enumerate(keys):
            with conn.transaction():
                written.append(outbox.enqueue_sync(conn, task.call(number), key=key).job_id)
    return written


@dataclass
class RelayProcess:
    proc: subprocess.Popen[bytes]
    log: Path

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()

    def lines(self) -> str:
        return self.log.read_text(errors="replace")


def start_relay(
    log_dir: Path, dsn: str, settings: Settings, table: str, *, batch_size: int = 50
) -> RelayProcess:
    env = dict(os.environ)
    env.update(
        EVSCHED_KAFKA_BOOTSTRAP=settings.bootstrap,
        EVSCHED_NAMESPACE=settings.namespace,
        EVSCHED_EVENT_PARTITIONS=str(settings.event_partitions),
    )
    log = log_dir / f"relay-{unique_name('')}.log"
    argv = [
        sys.executable, "-m", "evsched", "relay", "--dsn", dsn, "--table", table,
        "--batch-size", str(batch_size), "--poll-s", "0.2",
    ]  # fmt: skip
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)
    return RelayProcess(proc, log)


@dataclass(frozen=True)
class Orders:
    """A fresh outbox table and the app whose jobs go in it: orders are committed to it, relay
    processes (logging under ``logs``) drain it."""

    dsn: str
    settings: Settings
    table: str
    app: App
    logs: Path

    @classmethod
    def fresh(cls, dsn: str, settings: Settings, logs: Path) -> Orders:
        return cls(dsn, settings, fresh_table(dsn), outbox_app(settings), logs)

    def commit(self, keys: list[str]) -> list[str]:
        """``commit_orders`` into this table: the job ids written."""
        return commit_orders(self.dsn, Outbox(self.table), self.app, keys)

    def start_relay(self, *, batch_size: int = 50) -> RelayProcess:
        return start_relay(self.logs, self.dsn, self.settings, self.table, batch_size=batch_size)


async def read_enqueues(settings: Settings) -> list[tuple[JobEnqueued, Position]]:
    """Every record of the events topic, decoded (all must be JobEnqueued), in log order."""
    topic = Topics(settings.namespace).events
    count = await partition_count(settings.bootstrap, topic)
    tps = [TopicPartition(topic, p) for p in range(count)]
    consumer = kafka.consumer(settings, group_id=None, client_id="it-outbox-reader")
    await consumer.start()
    records: list[Any] = []
    try:
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        end = await consumer.end_offsets(tps)
        while any([await consumer.position(tp) < end[tp] for tp in tps]):
            batch = await consumer.getmany(timeout_ms=200)
            records += [r for rs in batch.values() for r in rs]
    finally:
        await consumer.stop()
    found = []
    for record in sorted(records, key=lambda r: (r.partition, r.offset)):
        try:
            event = avro.decode_event(record.value)
        except DecodeError:
            continue  # a foreign row's bytes: the nodes record it as undecodable
        assert isinstance(event, JobEnqueued), event
        assert record.key == event.job_id.encode(), "keyed by job id, as App.enqueue keys it"
        found.append(
            (
                event,
                Position(partition=record.partition, offset=record.offset, log_at=record.timestamp),
            )
        )
    return found


@dataclass(frozen=True)
class Verdicts:
    """The raw events topic folded: how the fold judged each job's enqueues."""

    folded: Replay
    copies: Counter[str]  # records per job id

    def applied(self, job_id: str) -> int:
        return self._count(job_id, Verdict.APPLIED)

    def _count(self, job_id: str, verdict: Verdict) -> int:
        return sum(1 for t in self.folded.job_timelines.get(job_id, []) if t.verdict is verdict)

    def assert_exactly_once(self, job_ids: list[str]) -> int:
        """Each job applied once; every other copy a ``duplicate``. Returns the duplicates."""
        assert self.folded.violations == [], self.folded.violations
        assert set(self.copies) == set(job_ids), "jobs in the log that were never committed"
        duplicates = 0
        for job_id in job_ids:
            assert self.applied(job_id) == 1, (job_id, self.folded.job_timelines.get(job_id))
            extra = self._count(job_id, Verdict.DUPLICATE)
            assert extra == self.copies[job_id] - 1, self.folded.job_timelines[job_id]
            duplicates += extra
        return duplicates


async def judge(settings: Settings) -> Verdicts:
    events = await read_enqueues(settings)
    return Verdicts(replay(events), Counter(e.job_id for e, _ in events))


async def judged_once_all_there(settings: Settings, count: int) -> Verdicts | None:
    """The judged log once it holds ``count`` jobs (for ``wait_for``); None before."""
    verdicts = await judge(settings)
    return verdicts if len(verdicts.copies) >= count else None


async def until_drained(dsn: str, table: str, timeout_s: float = 60.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while (left := await asyncio.to_thread(rows, dsn, table)) > 0:
        assert asyncio.get_running_loop().time() < deadline, f"{left} rows never relayed"
        await asyncio.sleep(0.05)
