"""The PostgreSQL outbox and its relay: commit-to-JobEnqueued latency, drain rate, relay CPU.

Not a test: it measures. A private PostgreSQL (durable defaults: fsync and synchronous commit on)
and a broker (``--bootstrap``, or a private one); ``evsched relay`` runs as its own process, so
its CPU is read from /proc. Three phases:

1. for each ``--rates`` (rows/s), ``--seconds`` of orders: each row committed in a transaction of
   its own by ``--connections`` connections, paced to the rate; the latency of a row is the
   broker's LogAppendTime of its JobEnqueued minus the moment its COMMIT was sent (same machine,
   same clock; so it includes the commit's own fsync), read back by a consumer of the events
   topic; p50/p99 and relay CPU per 1,000 rows; each rate first runs 3 s uncounted (warm-up), and
   is split over one generating process per 600 rows/s (one Python process tops out near 1,000);
2. with the relay stopped, ``--drain`` rows committed; then the relay started, and its rate from
   its first deleted row until the table is empty, with its CPU per 1,000 rows.

Prints one final line::

    p50_ms_500=<ms> p99_ms_500=<ms> ... drain_rows_per_s=<N> drain_cpu_ms_per_1000=<ms>

Run: ``.venv/bin/python bench/outbox.py`` (a private broker) or with ``--bootstrap HOST:PORT``.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psycopg
from aiokafka import AIOKafkaConsumer, TopicPartition

from evsched.adapters.kafka.topics import Topics, ensure_topics
from evsched.client import App
from evsched.devstack.broker import LocalBroker
from evsched.devstack.postgres import LocalPostgres
from evsched.devstack.process import free_port
from evsched.outbox import Outbox, init_table_sync
from evsched.settings import Settings

PARTITIONS = 6
# Rows/s one generating process commits steadily on this box (one Python process tops out near
# 1,000 rows/s); a higher rate is split over several processes, each with its own connections.
ROWS_PER_S_PER_PROCESS = 600
TICKS = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    """utime + stime of ``pid`` (its threads included), in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


@contextmanager
def services(args: argparse.Namespace) -> Iterator[tuple[str, str]]:
    """(bootstrap, dsn): the given broker or a private one, and a private PostgreSQL."""
    root = Path(tempfile.mkdtemp(prefix="evsched-bench-outbox-"))
    # A directory of its own under /tmp: as root, the server runs as the postgres user.
    postgres = LocalPostgres(Path(tempfile.mkdtemp(prefix="evsched-bench-pg-")), free_port())
    broker = None
    try:
        dsn = postgres.up().dsn
        bootstrap = args.bootstrap
        if not bootstrap:
            broker = LocalBroker(root / "kafka", free_port(), free_port(), ready_timeout_s=180)
            bootstrap = broker.up().bootstrap
        yield bootstrap, dsn
    finally:
        if broker is not None:
            broker.down()
        postgres.down()
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(postgres.data_dir, ignore_errors=True)


class Relay:
    client = "confluent"

    def __init__(self, dsn: str, settings: Settings, log: Path) -> None:
        env = {
            **os.environ,
            "EVSCHED_KAFKA_CLIENT": self.client,
            "EVSCHED_KAFKA_BOOTSTRAP": settings.bootstrap,
            "EVSCHED_NAMESPACE": settings.namespace,
            "EVSCHED_EVENT_PARTITIONS": str(settings.event_partitions),
        }
        argv = [sys.executable, "-m", "evsched", "relay", "--dsn", dsn, "--batch-size", "500"]
        with log.open("ab") as out:
            self.proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT)

    def cpu_s(self) -> float:
        return cpu_s(self.proc.pid)

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=60)


def make_app(settings: Settings) -> App:
    app = App(settings, name="bench-outbox")

    @app.task(name="shop.send_receipt")
    def send_receipt(order_id: int, email: str) -> None:
        """Only enqueued here."""

    return app


class Orders:
    """Commits orders, one row per transaction, and remembers when each commit returned."""

    def __init__(self, dsn: str, app: App, connections: int) -> None:
        self.dsn = dsn
        self.task = app.get_task("shop.send_receipt")
        self.outbox = Outbox()
        self.connections = connections
        self.committed_ms: dict[str, float] = {}
        self.number = 0

    async def paced(self, rate: float, seconds: float) -> float:
        """Commit at ``rate`` rows/s for ``seconds``; the rate achieved."""
        started = time.perf_counter()
        total = int(rate * seconds)
        slots = iter(range(total))

        async def worker() -> None:
            async with await psycopg.AsyncConnection.connect(self.dsn) as conn:
                for slot in slots:
                    delay = started + slot / rate - time.perf_counter()
                    if delay > 0:
                        await asyncio.sleep(delay)
                    await self.one(conn)

        await asyncio.gather(*(worker() for _ in range(self.connections)))
        return total / (time.perf_counter() - started)

    async def one(self, conn: psycopg.AsyncConnection[object]) -> None:
        self.number += 1
        call = self.task.call(self.number, f"c{self.number}@example.com")
        async with conn.transaction():
            entry = await self.outbox.enqueue(conn, call, key=f"order-{self.number}")
            # Taken as COMMIT is sent: the latency includes the commit itself. Taken after it
            # returns, a loaded box resumes this task late and the figure can come out negative.
            self.committed_ms[entry.job_id] = time.time_ns() / 1e6

    def bulk(self, count: int, per_transaction: int = 500) -> None:
        with psycopg.connect(self.dsn) as conn:
            for start in range(0, count, per_transaction):
                with conn.transaction():
                    for _ in range(min(per_transaction, count - start)):
                        self.number += 1
                        call = self.task.call(self.number, "bulk@example.com")
                        self.outbox.enqueue_sync(conn, call, key=f"order-{self.number}")


class LogReader:
    """Follows the (new) events topic from its start: each job id's first LogAppendTime."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap, enable_auto_commit=False, fetch_max_wait_ms=5
        )
        self.topic = topic
        self.appended_ms: dict[str, int] = {}
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self.consumer.start()
        tps = [TopicPartition(self.topic, p) for p in range(PARTITIONS)]
        self.consumer.assign(tps)
        # The topic is new: offset 0, set locally. Asking the broker for the end right after the
        # topic's creation can meet NotLeaderForPartition, and aiokafka's seek then never returned.
        for tp in tps:
            self.consumer.seek(tp, 0)
        self._task = asyncio.create_task(self._follow())

    async def _follow(self) -> None:
        while True:
            batch = await self.consumer.getmany(timeout_ms=100, max_records=5000)
            for records in batch.values():
                for r in records:
                    self.appended_ms.setdefault(r.key.decode(), r.timestamp)

    async def wait_for(self, job_ids: list[str], timeout_s: float = 120) -> None:
        deadline = time.perf_counter() + timeout_s
        while any(j not in self.appended_ms for j in job_ids):
            if time.perf_counter() > deadline:
                missing = sum(1 for j in job_ids if j not in self.appended_ms)
                raise SystemExit(f"{missing} jobs never reached the log")
            await asyncio.sleep(0.05)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
        await self.consumer.stop()


def pending(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        found = conn.execute("SELECT count(*) FROM evsched_outbox").fetchone()
    assert found is not None
    return int(found[0])


@dataclass(frozen=True)
class Share:
    """One generating process's part of a rate: its orders are numbered from ``first``."""

    dsn: str
    settings: Settings
    connections: int
    first: int
    rate: float
    seconds: float


def generate(share: Share) -> tuple[dict[str, float], float]:
    """Run in a process of the pool: (commit times by job id, rate achieved)."""
    orders = Orders(share.dsn, make_app(share.settings), share.connections)
    orders.number = share.first
    achieved = asyncio.run(orders.paced(share.rate, share.seconds))
    return orders.committed_ms, achieved


async def generated(
    pool: ProcessPoolExecutor, orders: Orders, settings: Settings, rate: int, seconds: float
) -> float:
    """Commit at ``rate`` for ``seconds`` in the pool's processes; their commits join ``orders``."""
    processes = max(1, math.ceil(rate / ROWS_PER_S_PER_PROCESS))
    loop = asyncio.get_running_loop()
    shares = [
        loop.run_in_executor(
            pool,
            generate,
            Share(
                dsn=orders.dsn,
                settings=settings,
                connections=max(1, orders.connections // processes),
                first=orders.number + (index + 1) * 10_000_000,
                rate=rate / processes,
                seconds=seconds,
            ),
        )
        for index in range(processes)
    ]
    achieved = 0.0
    for committed_ms, share_achieved in await asyncio.gather(*shares):
        orders.committed_ms.update(committed_ms)
        achieved += share_achieved
    orders.number += (processes + 1) * 10_000_000
    return achieved


async def rate_phase(
    *,
    pool: ProcessPoolExecutor,
    orders: Orders,
    settings: Settings,
    reader: LogReader,
    relay: Relay,
    rate: int,
    seconds: float,
) -> dict[str, str]:
    # Warm-up at the rate, not counted: the broker's and the relay's code paths hot at this load.
    await generated(pool, orders, settings, rate, min(3.0, seconds))
    await reader.wait_for(list(orders.committed_ms))
    orders.committed_ms.clear()
    cpu_before = relay.cpu_s()
    achieved = await generated(pool, orders, settings, rate, seconds)
    job_ids = list(orders.committed_ms)
    await reader.wait_for(job_ids)
    cpu = relay.cpu_s() - cpu_before
    latencies = [reader.appended_ms[j] - orders.committed_ms[j] for j in job_ids]
    return {
        f"p50_ms_{rate}": f"{percentile(latencies, 0.50):.1f}",
        f"p99_ms_{rate}": f"{percentile(latencies, 0.99):.1f}",
        f"achieved_per_s_{rate}": f"{achieved:.0f}",
        f"cpu_ms_per_1000_{rate}": f"{cpu * 1e6 / len(job_ids):.0f}",
    }


def drain_phase(
    orders: Orders, dsn: str, settings: Settings, count: int, log: Path
) -> dict[str, str]:
    """``count`` rows committed with no relay running, then one relay drains them."""
    orders.bulk(count)
    relay = Relay(dsn, settings, log)
    try:
        while (left := pending(dsn)) == count:  # the relay starting: not counted
            time.sleep(0.01)
        first_at, first_cpu, first_left = time.perf_counter(), relay.cpu_s(), left
        while pending(dsn) > 0:
            time.sleep(0.02)
        seconds = time.perf_counter() - first_at
        cpu = relay.cpu_s() - first_cpu
    finally:
        relay.stop()
    return {
        "drain_rows_per_s": f"{first_left / seconds:.0f}",
        "drain_cpu_ms_per_1000": f"{cpu * 1e6 / first_left:.0f}",
    }


async def rates(
    args: argparse.Namespace, bootstrap: str, dsn: str, log: Path
) -> tuple[dict[str, str], Orders, Settings]:
    namespace = f"bench-outbox-{os.urandom(3).hex()}"
    await ensure_topics(bootstrap, namespace, event_partitions=PARTITIONS, queues=["default"])
    settings = Settings(bootstrap=bootstrap, namespace=namespace, event_partitions=PARTITIONS)
    init_table_sync(dsn)
    orders = Orders(dsn, make_app(settings), args.connections)
    reader = LogReader(bootstrap, Topics(namespace).events)
    await reader.start()
    relay = Relay(dsn, settings, log)
    processes = max(1, math.ceil(max(args.rates) / ROWS_PER_S_PER_PROCESS))
    pool = ProcessPoolExecutor(processes, mp_context=multiprocessing.get_context("spawn"))
    figures: dict[str, str] = {}
    try:
        # Warm-up, not counted: until the relay is up (imports, producer) and relays.
        await orders.paced(50, 2.0)
        await reader.wait_for(list(orders.committed_ms))
        for rate in args.rates:
            figures |= await rate_phase(
                pool=pool,
                orders=orders,
                settings=settings,
                reader=reader,
                relay=relay,
                rate=rate,
                seconds=args.seconds,
            )
    finally:
        pool.shutdown()
        relay.stop()
        await reader.stop()
    return figures, orders, settings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bootstrap", default=os.environ.get("EVSCHED_KAFKA_BOOTSTRAP", ""))
    parser.add_argument("--rates", type=int, nargs="+", default=[500, 2000])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument("--drain", type=int, default=20_000)
    parser.add_argument(
        "--kafka-client",
        choices=["aiokafka", "confluent"],
        default=os.environ.get("EVSCHED_KAFKA_CLIENT", "confluent"),
        help="The relay's Kafka client (EVSCHED_KAFKA_CLIENT).",
    )
    args = parser.parse_args()
    Relay.client = args.kafka_client
    with services(args) as (bootstrap, dsn):
        log = Path(tempfile.gettempdir()) / f"bench-outbox-relay-{os.getpid()}.log"
        figures, orders, settings = asyncio.run(rates(args, bootstrap, dsn, log))
        if args.drain > 0:
            figures |= drain_phase(orders, dsn, settings, args.drain, log)
    print(" ".join(f"{k}={v}" for k, v in figures.items()))


if __name__ == "__main__":
    main()
