"""Batch enqueue against single enqueues on a real broker; the last line is ``key=value`` pairs.

One App enqueues ``COUNT`` jobs one call at a time (each waits for its acknowledgement), then the
same number through ``enqueue_many`` in batches of ``BATCH`` (one round trip each), then through
atomic batches (one Kafka transaction each). The runs are interleaved ``ROUNDS`` times so a loaded
machine slows both alike. Needs ``EVSCHED_KAFKA_BOOTSTRAP``; makes a namespace of its own.

Run: ``EVSCHED_KAFKA_BOOTSTRAP=127.0.0.1:19092 .venv/bin/python bench/batch.py [COUNT] [BATCH]``.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time

from evsched.adapters.kafka.topics import ensure_topics
from evsched.client import App, Outcome
from evsched.settings import Settings

ROUNDS = 2


def make_app(settings: Settings) -> App:
    app = App(settings, name="bench-batch")

    @app.task(name="bench.noop", queue="bench")
    async def noop(n: int) -> None:
        return None

    return app


async def singles(app: App, count: int) -> float:
    task = app.get_task("bench.noop")
    start = time.perf_counter()
    for n in range(count):
        await task.enqueue(n)
    return count / (time.perf_counter() - start)


async def batches(app: App, count: int, size: int, *, atomic: bool) -> float:
    task = app.get_task("bench.noop")
    start = time.perf_counter()
    for first in range(0, count, size):
        calls = [task.call(n) for n in range(first, min(first + size, count))]
        results = await app.enqueue_many(calls, atomic=atomic)
        bad = [r for r in results if r.outcome is not Outcome.ACCEPTED]
        if bad:
            raise SystemExit(f"batch refused: {bad[0]}")
    return count / (time.perf_counter() - start)


async def main(count: int, size: int) -> None:
    bootstrap = os.environ.get("EVSCHED_KAFKA_BOOTSTRAP", "127.0.0.1:19092")
    namespace = f"benchbatch{os.urandom(3).hex()}"
    await ensure_topics(bootstrap, namespace, event_partitions=3, queues=["bench"])
    settings = Settings(bootstrap=bootstrap, namespace=namespace)
    single, batched, atomic = [], [], []
    async with make_app(settings) as app:
        await singles(app, 10)  # producer, metadata and transaction coordinator warmed up
        await batches(app, size, size, atomic=True)
        for _ in range(ROUNDS):
            single.append(await singles(app, count))
            batched.append(await batches(app, count, size, atomic=False))
            atomic.append(await batches(app, count, size, atomic=True))
    best = {"single": max(single), "batch": max(batched), "atomic": max(atomic)}
    for name, rate in best.items():
        print(f"{name:>7}: {rate:10.0f} jobs/s")
    ratio = best["batch"] / best["single"]
    atomic_ratio = best["atomic"] / best["single"]
    print(f"batch/single={ratio:.1f}x atomic/single={atomic_ratio:.1f}x")
    print(
        f"count={count} batch_size={size} single_per_s={best['single']:.0f} "
        f"batch_per_s={best['batch']:.0f} atomic_per_s={best['atomic']:.0f} "
        f"batch_ratio={ratio:.1f} atomic_ratio={atomic_ratio:.1f}"
    )


if __name__ == "__main__":
    arguments = [int(a) for a in sys.argv[1:3]]
    asyncio.run(main(*(arguments + [2_000, 500][len(arguments) :])))
