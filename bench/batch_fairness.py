"""A single ``POST /v1/jobs`` beside concurrent ``POST /v1/jobs:batch`` calls (issue 32).

Starts ``evsched api`` (its own process, ``--no-auth``, on loopback) over a fresh namespace on a
running broker, as ``bench/live_streams.py`` does. Then ``--clients`` clients each post
batches of ``--batch`` jobs back to back for ``--seconds``, while one more client posts a single
job every ``--every-s`` seconds. Prints the singles' latency p50/p99/max (alone first, for
``--seconds`` too, then beside the batches), the batches' latency, the jobs/s the batches wrote,
and the event loop lag of the API as ``/healthz`` saw it (its answer time, p99).

The last line is ``clients=<n> batch=<m> single_alone_p99_ms=... single_p50_ms=...
single_p99_ms=... single_max_ms=... batch_p50_ms=... batch_jobs_per_s=... healthz_p99_ms=...
single_202=... batch_202=...`` (202: the verdict was not known within the API's timeout).

Run: ``EVSCHED_KAFKA_BOOTSTRAP=127.0.0.1:19092 .venv/bin/python bench/batch_fairness.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx

from e2e import pct
from evsched.adapters.kafka.topics import ensure_topics
from evsched.devstack.process import free_port
from live_streams import api_process, ready

UNCONFIRMED: dict[str, int] = {}  # 202s per path: out of time before the verdict was known


async def timed(http: httpx.AsyncClient, path: str, body: object, took: list[float]) -> None:
    started = time.perf_counter()
    response = await http.post(path, json=body)
    took.append((time.perf_counter() - started) * 1000)
    if response.status_code == 202:
        UNCONFIRMED[path] = UNCONFIRMED.get(path, 0) + 1
    elif response.status_code not in (200, 201):
        raise SystemExit(f"{path} answered {response.status_code}: {response.text[:300]}")


async def singles(http: httpx.AsyncClient, every_s: float, ends: float) -> list[float]:
    took: list[float] = []
    pending = []
    while time.monotonic() < ends:
        body = {"task": "bench.single", "args": [len(pending)]}
        pending.append(asyncio.create_task(timed(http, "/v1/jobs", body, took)))
        await asyncio.sleep(every_s)
    await asyncio.gather(*pending)
    return took


async def batches(http: httpx.AsyncClient, size: int, ends: float, took: list[float]) -> int:
    written = 0
    while time.monotonic() < ends:
        body = {"jobs": [{"task": "bench.batch", "args": [n]} for n in range(size)]}
        await timed(http, "/v1/jobs:batch", body, took)
        written += size
    return written


async def probe(http: httpx.AsyncClient, ends: float) -> list[float]:
    took: list[float] = []
    while time.monotonic() < ends:
        started = time.perf_counter()
        await http.get("/healthz")
        took.append((time.perf_counter() - started) * 1000)
        await asyncio.sleep(0.1)
    return took


def profile(pid: int, out: str, seconds: float) -> subprocess.Popen[bytes]:
    """py-spy (``pip install py-spy``) sampling the API while the batches run: folded stacks."""
    spy = Path(sys.executable).with_name("py-spy")
    command = [str(spy), "record", "-p", str(pid), "-r", "100", "-d", str(int(seconds))]
    return subprocess.Popen([*command, "--format", "raw", "-o", out, "--nonblocking"])


async def main(args: argparse.Namespace) -> None:
    namespace = f"benchfair{uuid.uuid4().hex[:8]}"
    await ensure_topics(
        args.bootstrap, namespace, event_partitions=args.partitions, queues=["default"]
    )
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    with api_process(args, namespace, port) as pid:
        limits = httpx.Limits(max_connections=args.clients + 10)
        async with httpx.AsyncClient(base_url=base, timeout=120, limits=limits) as http:
            await ready(http, 60)
            warm: list[float] = []
            await batches(http, args.batch, time.monotonic() + 2, warm)
            alone = await singles(http, args.every_s, time.monotonic() + args.seconds)
            ends = time.monotonic() + args.seconds
            spy = profile(pid, args.profile, args.seconds) if args.profile else None
            batch_took: list[float] = []
            started = time.monotonic()
            single, lag, *written = await asyncio.gather(
                singles(http, args.every_s, ends),
                probe(http, ends),
                *(batches(http, args.batch, ends, batch_took) for _ in range(args.clients)),
            )
            rate = sum(written) / (time.monotonic() - started)
            if spy is not None:
                spy.wait(60)
    print(f"single alone: p50 {pct(alone, 50):.0f} ms, p99 {pct(alone, 99):.0f} ms")
    print(
        f"single beside {args.clients} batch clients: {len(single)} enqueues, p50 "
        f"{pct(single, 50):.0f} ms, p99 {pct(single, 99):.0f} ms, max {max(single):.0f} ms"
    )
    print(
        f"batches of {args.batch}: {len(batch_took)}, p50 {pct(batch_took, 50):.0f} ms, "
        f"max {max(batch_took):.0f} ms, {rate:.0f} jobs/s; /healthz p99 {pct(lag, 99):.0f} ms"
    )
    print(f"answered 202 (verdict not known in time): {UNCONFIRMED or 'none'}")
    print(
        f"clients={args.clients} batch={args.batch} single_alone_p99_ms={pct(alone, 99):.0f} "
        f"single_p50_ms={pct(single, 50):.0f} single_p99_ms={pct(single, 99):.0f} "
        f"single_max_ms={max(single):.0f} batch_p50_ms={pct(batch_took, 50):.0f} "
        f"batch_jobs_per_s={rate:.0f} healthz_p99_ms={pct(lag, 99):.0f} "
        f"single_202={UNCONFIRMED.get('/v1/jobs', 0)} "
        f"batch_202={UNCONFIRMED.get('/v1/jobs:batch', 0)}"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--bootstrap", default=os.environ.get("EVSCHED_KAFKA_BOOTSTRAP", "127.0.0.1:19092")
    )
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--batch", type=int, default=1_000)
    parser.add_argument("--every-s", type=float, default=0.5)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--profile", help="write the API's py-spy folded stacks here")
    parser.add_argument("--api-src", help="the src/ folder the API runs from (default: ours)")
    asyncio.run(main(parser.parse_args()))
