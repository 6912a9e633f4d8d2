"""Where an enqueue's time goes on a busy machine: one client setting or broker setting at a time.

Not a test: it measures. It starts a broker (unless ``--bootstrap``) and, unless ``--no-engine``,
``bench/e2e.py``'s node and worker, so the enqueues compete with the engine as in
``bench/vs_celery.py``. Then for each round and condition (``quiet``, and ``hog``: a busy loop in
its own process session pinned to one core) it runs every ``--variants`` entry in turn (the order
rotates each round), each a paced open-loop load of the no-op task at ``--rate`` jobs/s for
``--seconds``:

- ``base``: the client library's producer (idempotent, acks=all, linger 0) on ``--client``:
  ``confluent`` (librdkafka, the library's default) or ``aiokafka`` (default: what
  ``EVSCHED_KAFKA_CLIENT`` picks);
- ``linger=N``: the same with a linger of N ms (records wait up to N ms to share a request);
- ``producers=N``: N producers taking turns. aiokafka keeps one produce request in flight per
  broker connection, so an enqueue that arrives while a request is out waits for its whole round
  trip before its own request leaves; N producers have N requests out;
- ``threads=N/M``: the broker's ``num.network.threads``/``num.io.threads`` changed live (dynamic
  broker configs), the client as ``base``; the broker's own (2/4) are put back afterwards;
- ``gc-freeze``: ``gc.freeze()`` in the client before the phase;
- ``prebuilt``: every job built and encoded before the phase, then only appended (the library's
  ``EventLog.append``): the transport's own share of an enqueue, without evsched's job building;
- ``pace``: the paced load with no enqueue at all (each submit returns at once): what this probe's
  own pacing, timers and bookkeeping cost the client. An enqueue's own CPU is ``base`` less this.

Each phase prints the enqueue latency p50/p99/p99.9/max (the await of ``task.enqueue()``), the
client's event loop lag (how late the pacing's timer fires, p99 and max; until 2026-12-07 a 1 ms
timer of its own, which woke the loop every ms whatever ``--tick-ms``), and CPU seconds per
1,000 jobs (CPU-ms per job) of the client, broker, node and worker and the hog. The client's
figure is the enqueue's cost and the probe's own (``pace``). ``--tick-ms`` batches the pacing:
the jobs due within one tick start together, one timer for them all. With ``--request-log`` (a
broker started here) the broker logs every request it completes (``kafka.request.logger`` at
DEBUG, set live) and the phase also prints the client's Produce requests as the broker saw them:
count, records per request, and the p50/p99 of each part of the broker's time (queue: waiting
for an I/O thread; local: the append; response queue and send: the way back) against the
client's own wait.

Ends with one line of ``key=value`` pairs: the client, then per condition and variant the medians
over the rounds of enqueue p99, loop lag p99 and the client's CPU-ms per enqueue.

Run: ``.venv/bin/python bench/enqueue_path.py --rounds 2 --variants base,linger=2,producers=4``.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import itertools
import json
import os
import re
import signal
import statistics
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from celery_stack import Hog
from e2e import (
    Cluster,
    Submit,
    _cpu_s,
    define_noop,
    noop_submit,
    paced_with,
    pct,
    py_spy,
    run_once,
    warm_up,
)
from evsched.adapters.kafka.event_log import KafkaEventLog
from evsched.adapters.kafka.event_log_choice import CLIENTS, kafka_client
from evsched.adapters.kafka.queues import FixedQueues
from evsched.adapters.kafka.rdkafka_event_log import RdkafkaEventLog
from evsched.adapters.kafka.topics import ensure_topics
from evsched.client import App, Task
from evsched.commands import encode_checked
from evsched.devstack.config import default_cache_root
from evsched.devstack.toolchain import JAVA_HINT, KafkaDist, kafka_version, require_tool
from evsched.errors import PublishError
from evsched.ports import Appended, EventLog, Outbound

BROKER_THREADS = {"num.network.threads": "2", "num.io.threads": "4"}  # devstack's own


class TakingTurns:
    """Several event logs, each append on the next: as many produce requests in flight."""

    def __init__(self, logs: Sequence[EventLog]) -> None:
        self._logs = list(logs)
        self._turns = itertools.cycle(self._logs)

    async def start(self) -> None:
        await asyncio.gather(*(log.start() for log in self._logs))

    async def close(self) -> None:
        await asyncio.gather(*(log.close() for log in self._logs))

    async def append(
        self, topic: str, key: str, value: bytes, headers: Sequence[tuple[str, bytes]] = ()
    ) -> Appended:
        return await next(self._turns).append(topic, key, value, headers)

    async def append_many(
        self, topic: str, records: Sequence[Outbound]
    ) -> list[Appended | PublishError]:
        return await next(self._turns).append_many(topic, records)

    async def append_atomic(self, topic: str, records: Sequence[Outbound]) -> list[Appended]:
        return await next(self._turns).append_atomic(topic, records)

    async def partition_count(self, topic: str) -> int:
        return await self._logs[0].partition_count(topic)


@dataclass(frozen=True)
class Variant:
    name: str
    linger_ms: int = 0
    producers: int = 1
    freeze: bool = False  # gc.freeze() first: what exists before the phase is never collected
    prebuilt: bool = False  # jobs built and encoded before the phase: only the append is timed
    pace: bool = False  # no enqueue: the probe's own cost
    threads: dict[str, str] = field(default_factory=dict)

    @classmethod
    def parse(cls, text: str) -> Variant:
        kind, _, value = text.partition("=")
        flags = {
            "base": cls(text),
            "gc-freeze": cls(text, freeze=True),
            "prebuilt": cls(text, prebuilt=True),
            "pace": cls(text, pace=True),
        }
        if kind in flags and not value:
            return flags[kind]
        if kind == "linger" and value.isdigit():
            return cls(text, linger_ms=int(value))
        if kind == "producers" and value.isdigit() and int(value) >= 1:
            return cls(text, producers=int(value))
        network, _, io = value.partition("/")
        if kind == "threads" and network.isdigit() and io.isdigit():
            return cls(text, threads={"num.network.threads": network, "num.io.threads": io})
        raise ValueError(
            f"{text!r}: base, gc-freeze, prebuilt, pace, linger=N, producers=N or threads=NET/IO"
        )

    def log(self, cluster: Cluster, client_id: str) -> EventLog:
        def one(i: int) -> EventLog:
            name = f"{client_id}-{i}"
            if cluster.args.client == "aiokafka":
                options = {"linger_ms": self.linger_ms} if self.linger_ms else {}
                return KafkaEventLog(cluster.settings, client_id=name, producer_options=options)
            linger = {"linger.ms": self.linger_ms} if self.linger_ms else {}
            return RdkafkaEventLog(cluster.settings, client_id=name, producer_options=linger)

        if self.producers == 1:
            return one(0)
        return TakingTurns([one(i) for i in range(self.producers)])


class GcPauses:
    """The client's garbage collections while it is entered: each pause in ms, by generation."""

    def __init__(self) -> None:
        self.pauses_ms: dict[int, list[float]] = {0: [], 1: [], 2: []}
        self._started = 0.0

    def _note(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.pauses_ms[info["generation"]].append((time.perf_counter() - self._started) * 1000)

    def __enter__(self) -> GcPauses:
        gc.callbacks.append(self._note)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._note)

    def line(self) -> str:
        pauses = ", ".join(
            f"gen{g} {len(p)}x max {max(p, default=0.0):.1f} ms" for g, p in self.pauses_ms.items()
        )
        return f"{pauses}; {len(gc.get_objects())} objects tracked, {gc.get_freeze_count()} frozen"


async def prebuilt_submit(app: App, task: Task, count: int) -> Submit:
    """``count`` no-op jobs built and encoded now; submitting one only appends its record."""
    log = await app.event_log()
    topic = app.topics.events
    records = []
    for _ in range(count):
        event = task.options().build((), {}, app.clock.now_ms())
        records.append((event.job_id, encode_checked(event)))

    async def submit(i: int, delayed: bool) -> str:
        job_id, value = records[i]
        await log.append(topic, job_id, value)
        return job_id

    return submit


async def no_submit(i: int, delayed: bool) -> str:
    """``pace``: the probe's work around an enqueue, without the enqueue."""
    return f"paced-{i}"


# --- the broker's side --------------------------------------------------------------------------

_COMPLETED = re.compile(r"Completed request:(\{.*\})")
_PARTS = ("requestQueueTimeMs", "localTimeMs", "responseQueueTimeMs", "sendTimeMs", "totalTimeMs")


@dataclass
class RequestLog:
    """The broker's request log (server.log), read from where the last phase left it."""

    path: Path
    read_at: int = 0

    def skip_to_end(self) -> None:
        self.read_at = self.path.stat().st_size if self.path.exists() else 0

    def produce_requests(self, client_prefix: str) -> list[dict[str, Any]]:
        found = []
        chunk = b""
        if self.path.stat().st_size < self.read_at:  # rolled over: the rest is in server.log.1
            with self.path.with_name(self.path.name + ".1").open("rb") as f:
                f.seek(self.read_at)
                chunk = f.read()
            self.read_at = 0
        with self.path.open("rb") as f:
            f.seek(self.read_at)
            chunk += f.read()
            self.read_at = f.tell()
        for line in chunk.decode("utf-8", "replace").splitlines():
            if (m := _COMPLETED.search(line)) is None:
                continue
            try:
                desc = json.loads(m.group(1))
            except ValueError:
                continue
            header = desc.get("requestHeader", {})
            if header.get("requestApiKey") == 0 and str(header.get("clientId", "")).startswith(
                client_prefix
            ):
                found.append(desc)
        return found


def request_line(requests: list[dict[str, Any]], jobs: int) -> str:
    if not requests:
        return "broker: no Produce requests logged"
    parts = " ".join(
        f"{part.removesuffix('TimeMs')}={pct([r.get(part, 0.0) for r in requests], 50):.2f}/"
        f"{pct([r.get(part, 0.0) for r in requests], 99):.2f}"
        for part in _PARTS
    )
    return (
        f"broker: {len(requests)} Produce requests, {jobs / len(requests):.2f} jobs each; {parts}"
    )


def set_request_logging(cluster: Cluster, level: str) -> None:
    """``kafka.request.logger`` to ``level`` on the running broker (Kafka's ConfigCommand)."""
    dist = KafkaDist(version=kafka_version(), cache_root=default_cache_root())
    java = require_tool("java", JAVA_HINT)
    command = [java, "-Xmx128m", "-cp", dist.classpath, "kafka.admin.ConfigCommand"]
    command += ["--bootstrap-server", cluster.bootstrap, "--entity-type", "broker-loggers"]
    command += ["--entity-name", "1", "--alter", "--add-config", f"kafka.request.logger={level}"]
    subprocess.run(command, check=True, capture_output=True, timeout=120)


async def set_broker_threads(cluster: Cluster, threads: dict[str, str]) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=cluster.bootstrap)
    await admin.start()
    try:
        await admin.alter_configs([ConfigResource(ConfigResourceType.BROKER, "1", threads)])
    finally:
        await admin.close()


# --- the run ------------------------------------------------------------------------------------


@dataclass
class Probe:
    cluster: Cluster
    hog: Hog
    requests: RequestLog | None
    # Per (condition, variant), each round's enqueue p99, loop lag p99 and client CPU-ms per job.
    results: dict[tuple[str, str], list[tuple[float, float, float]]] = field(default_factory=dict)

    def pids(self) -> dict[str, int]:
        found = {"client": os.getpid()}
        if self.cluster.broker_pid is not None:
            found["broker"] = self.cluster.broker_pid
        for proc in self.cluster.nodes + self.cluster.workers:
            found[proc.name] = proc.pid
        if self.hog.popen is not None:
            found["hog"] = self.hog.popen.pid
        return found

    async def phase(self, variant: Variant, condition: str, round_: int) -> None:
        a = self.cluster.args
        client_id = f"probe-{round_}-{condition}-{variant.name}".replace("=", "").replace("/", "-")
        app = App(
            self.cluster.settings,
            name=client_id,
            log_factory=lambda: variant.log(self.cluster, client_id),
            queues=FixedQueues(["default"]),
        )
        task = define_noop(app)
        if variant.threads:
            await set_broker_threads(self.cluster, variant.threads)
        try:
            async with app:
                await task.enqueue()  # the producers connect outside the measure
                if self.requests is not None:
                    self.requests.skip_to_end()
                pids = self.pids()
                spy = self.profile(client_id)
                if variant.freeze:
                    gc.freeze()
                before = {name: _cpu_s(pid) for name, pid in pids.items()}
                submit = noop_submit(task, a.delay_s)
                if variant.prebuilt:
                    submit = await prebuilt_submit(app, task, int(a.rate * a.seconds))
                if variant.pace:
                    submit = no_submit
                with GcPauses() as collections:
                    sent = await paced_with(submit, a.rate, a.seconds, 0.0, a.tick_ms / 1000)
                used = {name: _cpu_s(pid) - before[name] for name, pid in pids.items()}
                if spy is not None:
                    spy.send_signal(signal.SIGINT)
                    await asyncio.to_thread(spy.wait, 30)
        finally:
            gc.unfreeze()
            if variant.threads:
                await set_broker_threads(self.cluster, BROKER_THREADS)
        jobs = len(sent.jobs)
        lat, lags = sent.latencies_ms, sent.late_ms
        cpu = " ".join(f"{name}={s / jobs * 1000:.2f}" for name, s in used.items())
        print(
            f"r{round_} {condition} {variant.name}: {jobs} jobs, enqueue p50={pct(lat, 50):.2f} "
            f"p99={pct(lat, 99):.2f} p99.9={statistics.quantiles(lat, n=1000)[998]:.2f} "
            f"max={max(lat):.1f} ms; loop lag p99={pct(lags, 99):.2f} max={max(lags):.1f} ms; "
            f"CPU-s/1k jobs {cpu}",
            flush=True,
        )
        print(f"  client GC: {collections.line()}", flush=True)
        if self.requests is not None:
            print("  " + request_line(self.requests.produce_requests(client_id), jobs), flush=True)
        figures = (pct(lat, 99), pct(lags, 99), used["client"] / jobs * 1000)
        self.results.setdefault((condition, variant.name), []).append(figures)

    def profile(self, name: str) -> subprocess.Popen[bytes] | None:
        """py-spy on this process (the client) into ``--profile``, folded stacks."""
        out = self.cluster.args.profile
        if out is None:
            return None
        Path(out).mkdir(parents=True, exist_ok=True)
        return py_spy(os.getpid(), Path(out) / f"{name}.folded")

    async def run(self, variants: list[Variant]) -> str:
        a = self.cluster.args
        if not a.engine and a.warmup_s > 0:  # the broker's JIT and the client's first requests
            app = App(self.cluster.settings, name="probe-warm-up")
            async with app:
                await paced_with(noop_submit(define_noop(app), 0), a.rate, a.warmup_s, 0.0)
        for round_ in range(1, a.rounds + 1):
            turn = (round_ - 1) % len(variants)
            order = variants[turn:] + variants[:turn]
            for condition in a.conditions.split(","):
                if condition == "hog":
                    self.hog.start()
                try:
                    for variant in order:
                        await self.phase(variant, condition, round_)
                        await asyncio.sleep(a.settle_s)  # the engine's backlog drains
                finally:
                    self.hog.stop()
        pairs = [f"client={a.client}"]
        for (condition, name), figures in self.results.items():
            key = f"{condition}_{name}".replace("=", "").replace("/", "_")
            p99, lag, cpu = (statistics.median(f[i] for f in figures) for i in range(3))
            pairs.append(
                f"{key}_enqueue_p99_ms={p99:.2f} {key}_lag_p99_ms={lag:.2f} "
                f"{key}_client_cpu_ms={cpu:.3f}"
            )
        return " ".join(pairs)


async def measure(cluster: Cluster) -> str:
    a = cluster.args
    await ensure_topics(
        cluster.bootstrap, cluster.namespace, event_partitions=a.partitions, queues=["default"]
    )
    if a.engine:
        cluster.start_engine()
        warm = App(cluster.settings, name="probe-warm-up")
        async with warm:
            await warm_up(cluster, define_noop(warm))
    requests = None
    if a.request_log:
        if cluster.broker_dir is None:
            raise SystemExit("--request-log needs the broker started here (no --bootstrap)")
        set_request_logging(cluster, "DEBUG")
        requests = RequestLog(cluster.broker_dir / "logs" / "server.log")
    return await Probe(cluster, Hog(), requests).run(a.variants)


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--client", choices=CLIENTS, default=None, help="EVSCHED_KAFKA_CLIENT's")
    p.add_argument("--variants", default="base,linger=2,producers=4,threads=1/2,threads=4/8")
    p.add_argument("--conditions", default="quiet,hog", help="quiet, hog, or both (in this order)")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--rate", type=float, default=1000.0, help="jobs per second")
    p.add_argument("--seconds", type=float, default=15.0, help="per phase")
    p.add_argument(
        "--tick-ms", type=float, default=0.0, help="pacing: jobs due within it start together"
    )
    p.add_argument("--settle-s", type=float, default=5.0, help="pause after each phase")
    p.add_argument("--delay-s", type=float, default=0.0, help="delay of every job")
    p.add_argument("--no-engine", dest="engine", action="store_false", help="broker and client")
    p.add_argument("--request-log", action="store_true", help="the broker's Produce times")
    p.add_argument("--partitions", type=int, default=6)
    p.add_argument("--nodes", type=int, default=1)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--concurrency", type=int, default=100)
    p.add_argument("--warmup-s", type=float, default=10.0, help="unmeasured paced load first")
    p.add_argument("--delayed-share", type=float, default=0.0, help="(warm-up)")
    p.add_argument("--bootstrap", help="use this broker instead of starting one")
    p.add_argument("--broker-pid", type=int, help="with --bootstrap: count this pid's CPU")
    p.add_argument("--profile", help="py-spy the client into this dir, one file per phase")
    p.add_argument("--keep", action="store_true", help="keep the run directory")
    p.set_defaults(rss=False, node_args="")
    args = p.parse_args(argv)
    args.client = args.client or kafka_client()
    try:
        args.variants = [Variant.parse(text) for text in args.variants.split(",")]
    except ValueError as exc:
        p.error(f"--variants: {exc}")
    if set(args.conditions.split(",")) - {"quiet", "hog"}:
        p.error("--conditions: quiet, hog or quiet,hog")
    return args


def main() -> None:
    args = parse()
    print(run_once(Cluster(args, Path(tempfile.mkdtemp(prefix="evsched-probe-"))), measure))


if __name__ == "__main__":
    main()
