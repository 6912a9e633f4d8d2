"""confluent-kafka's two ways into asyncio for the EventLog, measured on one broker, interleaved.

Not a test: it measures. ``aio`` is ``confluent_kafka.aio.AIOProducer`` (blocking calls on a thread
pool, records buffered in Python until ``batch_size`` or ``flush``); ``thread`` is the synchronous
``Producer`` called on the event loop (``produce`` never blocks) with one thread serving its
delivery reports (``poll``), each ack handed to the loop with ``call_soon_threadsafe``;
``adapter`` is what ships, ``adapters.kafka.rdkafka_event_log.RdkafkaEventLog``: the ``thread``
design plus the ack bound, handing the acks over once per poll rather than once per record.
All are idempotent, acks=all, linger 0, on a fresh 6-partition LogAppendTime topic. Rounds
alternate them (the machine is shared: never compare runs made at different times). CPU is
``time.process_time()``, which counts librdkafka's threads.

Two workloads: an awaited single append (produce, wait for its ack) and ``append_many`` of 1,000
records (produce all, wait for every ack). Prints per-round figures, then one final line of
medians (one line in the output)::

    aio_single_cpu_us=.. aio_single_per_s=.. thread_single_cpu_us=.. thread_single_per_s=..
    adapter_single_cpu_us=.. adapter_single_per_s=.. aio_many_cpu_us=.. (and so on for many)

Run: ``.venv/bin/python bench/rdkafka_transports.py --bootstrap 127.0.0.1:19092 --rounds 5``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import threading
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from confluent_kafka.aio import AIOProducer

from evsched.adapters.kafka.rdkafka_event_log import RdkafkaEventLog
from evsched.ports import Outbound
from evsched.settings import Settings

VALUE = os.urandom(150)
PARTITIONS = 6


def conf(bootstrap: str) -> dict[str, Any]:
    return {
        "bootstrap.servers": bootstrap,
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": 0,
    }


class ThreadBridge:
    """The synchronous Producer with a poll thread; acks become asyncio futures."""

    def __init__(self, bootstrap: str) -> None:
        self.loop = asyncio.get_running_loop()
        self.producer = Producer(conf(bootstrap))
        self.running = True
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while self.running:
            self.producer.poll(0.1)

    def send(self, topic: str, key: bytes) -> asyncio.Future[Any]:
        future = self.loop.create_future()

        def delivered(err: Any, msg: Any) -> None:
            self.loop.call_soon_threadsafe(_settle, future, err, msg)

        self.producer.produce(topic, VALUE, key, on_delivery=delivered)
        return future

    async def single(self, topic: str, n: int) -> None:
        for i in range(n):
            await self.send(topic, b"k%d" % i)

    async def many(self, topic: str, n: int) -> None:
        await asyncio.gather(*[self.send(topic, b"k%d" % i) for i in range(n)])

    async def close(self) -> None:
        self.running = False
        await asyncio.to_thread(self.thread.join)
        await asyncio.to_thread(self.producer.flush, 10)


def _settle(future: asyncio.Future[Any], err: Any, msg: Any) -> None:
    if future.done():
        return
    if err is not None:
        future.set_exception(RuntimeError(str(err)))
    else:
        future.set_result(msg)


class Adapter:
    """What ships: RdkafkaEventLog (the thread bridge, acks handed over once per poll)."""

    def __init__(self, bootstrap: str) -> None:
        self.log = RdkafkaEventLog(Settings(bootstrap=bootstrap), client_id="bench-rdkafka")

    async def single(self, topic: str, n: int) -> None:
        for i in range(n):
            await self.log.append(topic, f"k{i}", VALUE)

    async def many(self, topic: str, n: int) -> None:
        await self.log.append_many(topic, [Outbound(f"k{i}", VALUE) for i in range(n)])

    async def close(self) -> None:
        await self.log.close()


class Aio:
    """confluent_kafka.aio.AIOProducer as its docs use it: produce, then flush to send now."""

    def __init__(self, bootstrap: str) -> None:
        self.producer = AIOProducer(conf(bootstrap), batch_size=1000)

    async def single(self, topic: str, n: int) -> None:
        for i in range(n):
            future = await self.producer.produce(topic, VALUE, b"k%d" % i)
            await self.producer.flush()  # else it waits for batch_size or buffer_timeout (1 s)
            await future

    async def many(self, topic: str, n: int) -> None:
        futures = [await self.producer.produce(topic, VALUE, b"k%d" % i) for i in range(n)]
        await self.producer.flush()
        await asyncio.gather(*futures)

    async def close(self) -> None:
        await self.producer.close()


async def measure(run: Callable[[], Awaitable[None]], count: int) -> tuple[float, float]:
    """(CPU µs per record, records per second) of one run."""
    cpu, wall = time.process_time(), time.perf_counter()
    await run()
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    return cpu / count * 1e6, count / wall


async def main(bootstrap: str, rounds: int, singles: int, batches: int) -> None:
    topic = f"bench-rdkafka-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    created = admin.create_topics(
        [NewTopic(topic, PARTITIONS, 1, config={"message.timestamp.type": "LogAppendTime"})]
    )
    created[topic].result(30)
    transports: dict[str, Any] = {
        "aio": Aio(bootstrap),
        "thread": ThreadBridge(bootstrap),
        "adapter": Adapter(bootstrap),
    }
    results: dict[str, list[tuple[float, float]]] = {}
    try:
        for t in transports.values():  # connect, fetch metadata, get a producer id
            await t.many(topic, 100)
        for _ in range(rounds):
            for name, t in transports.items():
                results.setdefault(f"{name}_single", []).append(
                    await measure(lambda t=t: t.single(topic, singles), singles)
                )
                results.setdefault(f"{name}_many", []).append(
                    await measure(lambda t=t: _batches(t, topic, batches), batches * 1000)
                )
    finally:
        for t in transports.values():
            await t.close()
        admin.delete_topics([topic])[topic].result(30)
    fields = []
    for kind in ("single", "many"):
        for name in transports:
            runs = results[f"{name}_{kind}"]
            cpu = statistics.median(r[0] for r in runs)
            rate = statistics.median(r[1] for r in runs)
            cpus, rates = [round(r[0], 1) for r in runs], [round(r[1]) for r in runs]
            print(f"{name} {kind}: cpu_us={cpus} per_s={rates}")
            fields += [f"{name}_{kind}_cpu_us={cpu:.1f}", f"{name}_{kind}_per_s={rate:.0f}"]
    print(" ".join(fields))


async def _batches(t: Any, topic: str, batches: int) -> None:
    for _ in range(batches):
        await t.many(topic, 1000)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", default="127.0.0.1:19092")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--singles", type=int, default=500, help="awaited appends per round")
    parser.add_argument("--batches", type=int, default=10, help="append_many(1000) per round")
    args = parser.parse_args()
    asyncio.run(main(args.bootstrap, args.rounds, args.singles, args.batches))
