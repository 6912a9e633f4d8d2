"""``POST /v1/jobs`` latency while the dashboard's ``/live`` streams are open (issue 32).

Starts ``evsched api`` (a process of its own, ``--no-auth``, on loopback) over a fresh namespace
on a running broker, then runs two phases of a paced open-loop load of ``POST /v1/jobs`` at
``--rate`` requests/s for ``--seconds``: ``quiet`` with no stream open, and ``live`` with
``--streams`` anonymous ``GET /live`` streams held open (each read as it arrives, by a child
process, so reading them does not delay the timing). Each enqueue's answer waits for the API's
replica to fold it, so every enqueue is a commit that wakes the streams. Prints each phase's
latency p50/p99/max, the API process' CPU seconds, the overview events the streams received
and the streams the API refused (503).

When the API offers ``--max-live-streams`` both caps are set to ``--streams``, so the phase
measures the streams themselves, not their refusal; ``--api-src DIR`` runs the API from another
source tree (e.g. ``git archive`` of an older commit) to compare.

The last line is ``streams=<n> quiet_p50_ms=... quiet_p99_ms=... live_p50_ms=... live_p99_ms=...
api_cpu_s_quiet=... api_cpu_s_live=... overviews=... refused=...``.

Run: ``EVSCHED_KAFKA_BOOTSTRAP=127.0.0.1:19092 .venv/bin/python bench/live_streams.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import multiprocessing
import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from e2e import _cpu_s, pct
from evsched.adapters.kafka.topics import ensure_topics
from evsched.devstack.process import free_port

HERE = Path(__file__).resolve().parent


@contextlib.contextmanager
def api_process(args: argparse.Namespace, namespace: str, port: int) -> Iterator[int]:
    src = Path(args.api_src).resolve() if args.api_src else HERE.parent / "src"
    env = {
        **os.environ,
        "PYTHONPATH": str(src),
        "EVSCHED_KAFKA_BOOTSTRAP": args.bootstrap,
        "EVSCHED_NAMESPACE": namespace,
        "EVSCHED_EVENT_PARTITIONS": str(args.partitions),
    }
    command = [sys.executable, "-m", "evsched", "api", "--no-auth", "--port", str(port)]
    helped = subprocess.run(
        [*command, "--help"], check=True, env=env, capture_output=True, text=True
    )
    if getattr(args, "streams", 0) and "--max-live-streams" in helped.stdout:
        command += ["--max-live-streams", str(args.streams)]
        command += ["--max-anonymous-live-streams", str(args.streams)]
    with tempfile.TemporaryDirectory() as data:
        command += ["--data-dir", data]
        logs = (Path(data) / "api.log").open("wb")  # a pipe nobody reads would block the API
        proc = subprocess.Popen(command, env=env, stdout=logs, stderr=subprocess.STDOUT)
        try:
            yield proc.pid
        finally:
            proc.terminate()
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            logs.close()


async def ready(http: httpx.AsyncClient, deadline_s: float) -> None:
    ends = time.monotonic() + deadline_s
    while time.monotonic() < ends:
        with contextlib.suppress(httpx.TransportError):
            if (await http.get("/readyz")).status_code == 200:
                return
        await asyncio.sleep(0.2)
    raise SystemExit("the API did not become ready")


async def enqueue(http: httpx.AsyncClient, n: int, took: list[float]) -> None:
    started = time.perf_counter()
    response = await http.post("/v1/jobs", json={"task": "bench.noop", "args": [n]})
    took.append(time.perf_counter() - started)
    if response.status_code != 201:
        raise SystemExit(f"enqueue answered {response.status_code}: {response.text[:200]}")


async def paced(http: httpx.AsyncClient, rate: float, seconds: float) -> list[float]:
    took: list[float] = []
    started, pending = time.perf_counter(), []
    for n in range(int(rate * seconds)):
        await asyncio.sleep(max(0.0, started + n / rate - time.perf_counter()))
        pending.append(asyncio.create_task(enqueue(http, n, took)))
    await asyncio.gather(*pending)
    return took


class Streams:
    """``count`` streams of ``/live`` read in a process of their own (so reading them does not
    delay this process' timing of enqueues), each counting the overview events it receives."""

    def __init__(self, base: str, count: int) -> None:
        spawn = multiprocessing.get_context("spawn")
        self.shared = Shared(spawn.Event(), spawn.Event(), spawn.Value("q", 0), spawn.Value("q", 0))
        self.overviews, self.refused = self.shared.overviews, self.shared.refused
        self.process = spawn.Process(target=follow, args=(base, count, self.shared), daemon=True)
        self.process.start()

    async def wait_opened(self, deadline_s: float) -> None:
        if not await asyncio.to_thread(self.shared.opened.wait, deadline_s):
            raise SystemExit("the streams did not open")

    def close(self) -> None:
        self.shared.stop.set()
        self.process.join(30)
        if self.process.is_alive():
            self.process.kill()


@dataclass(frozen=True)
class Shared:
    """What the streams' process shares with this one."""

    opened: Any  # set once every stream got its first overview (or was refused)
    stop: Any
    overviews: Any  # overview events received, all streams together
    refused: Any  # streams the API refused


def follow(base: str, count: int, shared: Shared) -> None:
    asyncio.run(_follow_all(base, count, shared))


async def _follow_all(base: str, count: int, shared: Shared) -> None:
    """Plain sockets, not an HTTP client: reading 300 streams must cost this machine little."""
    host, port = base.removeprefix("http://").split(":")
    request = f"GET /live HTTP/1.1\r\nHost: {host}\r\nAccept: text/event-stream\r\n\r\n"
    seen = [0] * count

    async def one(i: int) -> None:
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(request.encode())
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            if not head.startswith(b"HTTP/1.1 200"):
                with shared.refused.get_lock():
                    shared.refused.value += 1
                seen[i] = -1
                return
            while chunk := await reader.read(1 << 16):
                events = chunk.count(b"event: overview")
                seen[i] += events
                if events:
                    with shared.overviews.get_lock():
                        shared.overviews.value += events
        finally:
            writer.close()

    tasks = [asyncio.create_task(one(i)) for i in range(count)]
    while not shared.stop.is_set():
        if not shared.opened.is_set() and all(seen):
            shared.opened.set()
        await asyncio.sleep(0.1)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def phase(
    http: httpx.AsyncClient, pid: int, args: argparse.Namespace
) -> tuple[list[float], float]:
    cpu = _cpu_s(pid)
    took = await paced(http, args.rate, args.seconds)
    return took, _cpu_s(pid) - cpu


def report(name: str, took: list[float], cpu: float) -> None:
    ms = [t * 1000 for t in took]
    print(
        f"{name}: {len(ms)} enqueues, p50 {pct(ms, 50):.1f} ms, p99 {pct(ms, 99):.1f} ms, "
        f"max {max(ms):.1f} ms; API CPU {cpu:.1f} s",
        flush=True,
    )


async def main(args: argparse.Namespace) -> None:
    namespace = f"benchlive{uuid.uuid4().hex[:8]}"
    await ensure_topics(
        args.bootstrap, namespace, event_partitions=args.partitions, queues=["default"]
    )
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    with api_process(args, namespace, port) as pid:
        async with httpx.AsyncClient(base_url=base, timeout=60) as http:
            await ready(http, 60)
            await paced(http, args.rate, 3)  # producer, replica and routes warmed up
            quiet, quiet_cpu = await phase(http, pid, args)
            report("quiet", quiet, quiet_cpu)
            streams = Streams(base, args.streams)
            try:
                await streams.wait_opened(60)
                before = streams.overviews.value
                live, live_cpu = await phase(http, pid, args)
                overviews = streams.overviews.value - before
            finally:
                streams.close()
            refused = streams.refused.value
            report(f"{args.streams} streams", live, live_cpu)
    print(f"streams received {overviews} overview events; the API refused {refused}")
    q, lv = [t * 1000 for t in quiet], [t * 1000 for t in live]
    print(
        f"streams={args.streams} rate={args.rate:g} quiet_p50_ms={pct(q, 50):.1f} "
        f"quiet_p99_ms={pct(q, 99):.1f} live_p50_ms={pct(lv, 50):.1f} "
        f"live_p99_ms={pct(lv, 99):.1f} api_cpu_s_quiet={quiet_cpu:.1f} "
        f"api_cpu_s_live={live_cpu:.1f} overviews={overviews} refused={refused}"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--bootstrap", default=os.environ.get("EVSCHED_KAFKA_BOOTSTRAP", "127.0.0.1:19092")
    )
    parser.add_argument("--streams", type=int, default=300)
    parser.add_argument("--rate", type=float, default=10.0, help="enqueues per second")
    parser.add_argument("--seconds", type=float, default=20.0, help="each phase's length")
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--api-src", help="the src/ folder the API runs from (default: ours)")
    asyncio.run(main(parser.parse_args()))
