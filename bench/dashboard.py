"""How fast the dashboard's overview loads with 1M jobs indexed: it reads counters, never the index.

The indexes are filled in this process the cheap way ``index_memory.py`` does (events
Avro-encoded and folded by the real Projector, no broker; every job enqueued, every
``--run-every``-th also leased, started and succeeded), under an API whose read replica
is a thin stand-in over those projectors, so the commit hooks (metrics and the dashboard's live
counters) see every batch as in ``evsched api``. Then ``GET /`` (the rendered page) and
``GET /overview.json`` are timed through the ASGI app, in process (no network, no browser).

The last line is ``jobs=<n> overview_p50_ms=<a> overview_p99_ms=<b> json_p99_ms=<c>``.

Run: ``.venv/bin/python bench/dashboard.py --jobs 1000000``.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import tempfile
import time
import uuid
import zlib
from collections.abc import Mapping
from pathlib import Path

import httpx

from evsched.adapters import avro
from evsched.adapters.index.store import PartitionIndex
from evsched.adapters.kafka.queues import FixedQueues
from evsched.api import create_app
from evsched.client import App
from evsched.ports import Record
from evsched.runtime.projection.projector import CommitHook, Projector
from evsched.settings import Settings
from index_memory import T0, Indexes, job_events


class Standin:
    """The ReplicaView of ``Indexes``: their projectors, caught up by construction."""

    def __init__(self, indexes: Indexes) -> None:
        self._indexes = indexes
        self.on_commit: CommitHook | None = None
        self.failing: dict[int, str] = {}

    @property
    def projectors(self) -> Mapping[int, Projector]:
        return dict(enumerate(self._indexes.projectors))

    @property
    def running(self) -> bool:
        return True

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None

    def partition_of(self, key: str) -> int:
        return zlib.crc32(key.encode()) % len(self._indexes.indexes)

    def index(self, partition: int) -> PartitionIndex:
        return self._indexes.indexes[partition]

    async def wait_for(self, partition: int, offset: int, timeout_s: float = 10.0) -> None:
        return None

    async def lag(self) -> dict[int, int]:
        return dict.fromkeys(range(len(self._indexes.indexes)), 0)


def add_chunk(indexes: Indexes, jobs: list[str], at: int, run_every: int) -> None:
    """Enqueue ``jobs``; every ``run_every``-th also leases, starts and succeeds (4 events)."""
    parts = len(indexes.indexes)
    for kind in range(4):
        steps: list[list[Record]] = [[] for _ in range(parts)]
        for i, job_id in enumerate(jobs):
            if kind and i % run_every:
                continue
            p = zlib.crc32(job_id.encode()) % parts
            value = avro.encode_event(job_events(job_id, at)[kind])
            offset, log_at = indexes.offsets[p], at + kind * 1000
            steps[p].append(Record("b.events", p, offset, log_at, None, value))
            indexes.offsets[p] += 1
        for projector, records in zip(indexes.projectors, steps, strict=True):
            if records:
                projector.commit(projector.fold(records))


def fill(indexes: Indexes, jobs: int, chunk: int, run_every: int) -> tuple[float, int]:
    """Seconds taken, and how many jobs ran to success."""
    started, done, ran = time.monotonic(), 0, 0
    while done < jobs:
        count = min(chunk, jobs - done)
        add_chunk(indexes, [str(uuid.uuid4()) for _ in range(count)], T0 + done, run_every)
        done += count
        ran += -(-count // run_every)
        if done % 100_000 < chunk:
            print(f"{done} jobs indexed ({time.monotonic() - started:.0f} s)", flush=True)
    return time.monotonic() - started, ran


async def timed(http: httpx.AsyncClient, path: str, n: int) -> list[float]:
    took = []
    for _ in range(n):
        started = time.perf_counter()
        response = await http.get(path)
        took.append((time.perf_counter() - started) * 1000)
        assert response.status_code == 200, response.text[:200]
    return took


def pct(values: list[float], p: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[int(p) - 1]


async def run(args: argparse.Namespace, root: Path) -> None:
    indexes = Indexes(root, args.partitions)
    settings = Settings(namespace="bench", event_partitions=args.partitions)
    client = App(settings, name="bench-dashboard", queues=FixedQueues(["default"]))
    queues = FixedQueues(["default"])
    api = create_app(settings, replica=Standin(indexes), app=client, queues=queues)
    try:
        took, ran = fill(indexes, args.jobs, args.chunk, args.run_every)
        print(f"indexed {args.jobs} jobs in {took:.0f} s")
        transport = httpx.ASGITransport(app=api)
        async with httpx.AsyncClient(transport=transport, base_url="http://bench") as http:
            first = await timed(http, "/", 1)
            page = await timed(http, "/", args.requests)
            data = await timed(http, "/overview.json", args.requests)
            shown = (await http.get("/overview.json")).json()
        total, succeeded = shown["total"], shown["totals"]["succeeded"]
        assert total == args.jobs, f"the overview counts {total} jobs, not {args.jobs}"
        # The lifetime totals are the indexes' tallies, summed: counters, like the rest.
        assert succeeded == ran, f"the overview's total counts {succeeded} successes, not {ran}"
        print(
            f"first GET /: {first[0]:.1f} ms; GET / x{args.requests}: p50 {pct(page, 50):.1f} "
            f"p99 {pct(page, 99):.1f} max {max(page):.1f} ms; GET /overview.json p50 "
            f"{pct(data, 50):.1f} p99 {pct(data, 99):.1f} ms"
        )
        print(
            f"jobs={total} overview_p50_ms={pct(page, 50):.1f} "
            f"overview_p99_ms={pct(page, 99):.1f} json_p99_ms={pct(data, 99):.1f}"
        )
    finally:
        await client.close()
        indexes.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=1_000_000)
    p.add_argument("--partitions", type=int, default=3)
    p.add_argument("--chunk", type=int, default=600, help="jobs folded together")
    p.add_argument("--run-every", type=int, default=10, help="every n-th job also runs to success")
    p.add_argument("--requests", type=int, default=200, help="timed requests per path")
    args = p.parse_args()
    root = Path(tempfile.mkdtemp(prefix="evsched-bench-dashboard-"))
    try:
        asyncio.run(run(args, root))
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
