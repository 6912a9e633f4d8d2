"""Soak: millions of no-op jobs at a steady rate with a short retention; does anything grow?

Not a test: it measures (issue 11, item 5). On ``--bootstrap`` (else a broker of its own) it
makes a fresh namespace whose jobs keep ``--retention-s`` of log time after they end (the key
window too), starts ``--nodes`` nodes, ``--workers`` workers and one API process (bench/e2e.py's
``Cluster``), and enqueues ``--jobs`` no-op jobs at ``--rate`` per second, open loop, a
``--delayed-share`` of them delayed by ``--delay-s`` (and keyed: the key window is exercised
too). Every ``--sample-s`` it samples:

- ``live_jobs``: jobs in the API's index (``evsched_jobs``, summed over statuses);
- ``node_disk_mb`` / ``api_disk_mb``: the nodes' and the API's data dirs on disk (RocksDB);
- ``node_rss_mb`` / ``api_rss_mb`` / ``worker_rss_mb``: resident memory (nodes and workers
  summed);
- ``node_sst_mb`` / ``api_sst_mb`` and ``node_wal_mb`` / ``api_wal_mb``: of those data dirs, the
  table files (the index's data) and the write-ahead logs (``*.log``; RocksDB's info log is
  ``LOG``), shown but not judged; the rest is the info log and the MANIFEST.

Per ``--chunk`` jobs (a million by default) it keeps each enqueue's acknowledgement time
(``enqueue``) and, for the delayed jobs, the log time of the applied AttemptStarted minus
``run_at`` (``lateness``, from the events topic folded with the core fold as it is written,
only for the delayed jobs in flight, so the soak's own memory stays flat).

At the end: each resource's median over the first and the last third of the samples taken
after ``--warmup-s`` (default 2.5 retentions: a purge's mark stays one more retention, so the
index holds up to two retentions of finished jobs in steady state), judged flat within
±10 %; the per-chunk percentiles side by side; and a last line of ``key=value`` pairs.

Full run (the lead's, on a quiet machine; 3M jobs at 400 per second, about 2 h 5 min):
``PYTHONPATH=$PWD/src .venv/bin/python bench/soak.py``. Short run:
``... bench/soak.py --jobs 60000 --rate 300 --retention-s 20 --chunk 20000 --sample-s 5``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from prometheus_client.parser import text_string_to_metric_families

from e2e import Cluster, Proc, _is_delayed, _script, define_noop, open_loop, wait_for
from evsched.adapters.avro import decode_event
from evsched.adapters.kafka.topics import Topics, ensure_topics
from evsched.client import App, Task
from evsched.core import ids
from evsched.core.events import AttemptStarted, Position
from evsched.core.fold import fold
from evsched.core.state import JobState, Verdict
from evsched.devstack.process import free_port
from evsched.errors import DecodeError
from evsched.settings import Settings
from soak_report import Chunks, Sample, dir_mb_by, report

# What the whole stack (broker, node, worker, the API's replica and this load generator) sustains
# on the quiet 2-core machine with the purges' extra event per job: it kept up with 400 jobs/s
# for 3M jobs, and built a backlog at 450 (docs/bench-log.md, "Soak"). 3M jobs take 2 h 5 min.
DEFAULT_RATE = 400.0


@dataclass
class SoakCluster(Cluster):
    """bench/e2e.py's cluster with a namespace retention and an API process."""

    api: Proc | None = None
    api_port: int = 0

    @property
    def settings(self) -> Settings:
        window = round(self.args.retention_s * 1000)
        return Settings(
            bootstrap=self.bootstrap,
            namespace=self.namespace,
            event_partitions=self.args.partitions,
            retention_ms=window,
            key_window_ms=window,
        )

    def env(self) -> dict[str, str]:
        window = str(round(self.args.retention_s * 1000))
        return {**super().env(), "EVSCHED_RETENTION_MS": window, "EVSCHED_KEY_WINDOW_MS": window}

    def spawn(self, name: str, command: Sequence[str], cwd: Path | None = None) -> Proc:
        env = self.env()
        if name.startswith("worker"):
            # A few lines per job: millions of jobs would fill the disk with them.
            env["EVSCHED_LOG_LEVEL"] = "warning"
        log_path = self.run_dir / f"{name}.log"
        with log_path.open("wb") as log:
            popen = subprocess.Popen(
                list(command), stdout=log, stderr=subprocess.STDOUT, env=env, cwd=cwd
            )
        return Proc(name, popen, log_path)

    def start_api(self) -> None:
        self.api_port = self.args.api_port or free_port()
        command = [_script("evsched"), "api", "--port", str(self.api_port), "--no-auth"]
        command += ["--data-dir", str(self.run_dir / "api")]
        self.api = self.spawn("api", command)

    def api_ready(self) -> bool:
        """The API answers /readyz with 200 (its replica caught up)."""
        url = f"http://127.0.0.1:{self.api_port}/readyz"
        try:
            with urllib.request.urlopen(url, timeout=1) as answer:
                return bool(answer.status == 200)
        except OSError:  # not listening yet, or 503 (urllib's HTTPError) while it catches up
            return False

    def poll_logs(self) -> None:
        super().poll_logs()  # raises when a node or worker exited
        if self.api is not None and self.api.popen.poll() is not None:
            code, path = self.api.popen.returncode, self.api.log_path
            raise RuntimeError(f"the API exited with {code}: {path}")

    def metrics(self) -> dict[str, float]:
        """The API's ``evsched_jobs`` (summed) and applied AttemptSucceeded, from /metrics."""
        url = f"http://127.0.0.1:{self.api_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as answer:
            text = answer.read().decode()
        found = {"live_jobs": 0.0, "succeeded": 0.0}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == "evsched_jobs":
                    found["live_jobs"] += sample.value
                elif sample.name == "evsched_events_folded_total" and sample.labels == {
                    "kind": "AttemptSucceeded",
                    "verdict": "applied",
                }:
                    found["succeeded"] = sample.value
        return found

    def sample(self) -> dict[str, float]:
        assert self.api is not None
        nodes = [self.run_dir / f"node-{i}" for i in range(1, self.args.nodes + 1)]
        # All files, the table files, the write-ahead logs: one walk per data dir.
        kinds = ("", ".sst", ".log")
        node_mb = [dir_mb_by(d, kinds) for d in nodes]
        api_mb = dir_mb_by(self.run_dir / "api", kinds)
        return {
            "live_jobs": self.metrics()["live_jobs"],
            "node_disk_mb": sum(d[""] for d in node_mb),
            "api_disk_mb": api_mb[""],
            "node_rss_mb": sum(p.rss_mb() for p in self.nodes),
            "api_rss_mb": self.api.rss_mb(),
            "worker_rss_mb": sum(p.rss_mb() for p in self.workers),
            "node_sst_mb": sum(d[".sst"] for d in node_mb),
            "api_sst_mb": api_mb[".sst"],
            "node_wal_mb": sum(d[".log"] for d in node_mb),
            "api_wal_mb": api_mb[".log"],
        }

    def stop(self) -> None:
        if self.api is not None and self.api.popen.poll() is None:
            self.api.popen.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.api.popen.wait(30)
            if self.api.popen.poll() is None:
                self.api.popen.kill()
                self.api.popen.wait()
        super().stop()


# --- lateness, from the events topic ------------------------------------------------------------


@dataclass
class Lateness:
    """Folds the events of the delayed jobs in flight; an applied start gives a lateness."""

    chunks: Chunks
    pending: dict[str, tuple[int, JobState | None]] = field(default_factory=dict)
    # Since the last sample: where in the run a stall was (printed beside each sample's clock).
    recent: list[float] = field(default_factory=list)

    def drain(self) -> str:
        """The starts since the last call, their worst lateness, and the wall clock."""
        worst = max(self.recent, default=0.0)
        clock = time.strftime("%H:%M:%S", time.gmtime())
        shown = f"starts={len(self.recent)} late_max_ms={worst:.0f} utc={clock}"
        self.recent.clear()
        return shown

    def expect(self, job_id: str, number: int) -> None:
        self.pending.setdefault(job_id, (number, None))

    def record(self, raw: Any) -> None:
        job_id = raw.key.decode() if raw.key else None
        if job_id not in self.pending:
            return  # not a delayed job in flight: not even decoded
        try:
            event = decode_event(raw.value or b"")
        except DecodeError:
            return
        number, state = self.pending[job_id]
        position = Position(partition=raw.partition, offset=raw.offset, log_at=raw.timestamp)
        after, entry = fold(state, event, position)
        if entry.verdict is not Verdict.APPLIED or after is None:
            return
        if isinstance(event, AttemptStarted):
            del self.pending[job_id]
            late = float(raw.timestamp - after.run_at)
            self.chunks.of(number).lateness_ms.append(late)
            self.recent.append(late)
        else:
            self.pending[job_id] = (number, after)


async def follow(settings: Settings, lateness: Lateness, stop: asyncio.Event) -> None:
    """Feed ``lateness`` from the events topic, from its start, until ``stop``."""
    topic = Topics(settings.namespace).events
    consumer = AIOKafkaConsumer(
        bootstrap_servers=settings.bootstrap,
        isolation_level="read_committed",
        enable_auto_commit=False,
        fetch_max_wait_ms=100,
    )
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(settings.event_partitions)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        while not stop.is_set():
            batches = await consumer.getmany(timeout_ms=200, max_records=5_000)
            for raws in batches.values():
                for raw in raws:
                    lateness.record(raw)
    finally:
        await consumer.stop()


# --- load and samples ---------------------------------------------------------------------------


async def offer(task: Task, args: argparse.Namespace, chunks: Chunks, late: Lateness) -> int:
    """``--jobs`` enqueues at ``--rate``/s, open loop; each one's time goes to its chunk.

    The delayed jobs carry an idempotency key (so the key window is exercised too), which gives
    their id before the enqueue: the follower must know them before their JobEnqueued arrives.
    """
    failed = 0

    async def one(i: int) -> None:
        nonlocal failed
        started = time.perf_counter()
        delayed = _is_delayed(i, args.delayed_share)
        key = f"soak-{i}"
        job_id = ids.job_id_for_key(task.spec.queue, key)
        if delayed:
            late.expect(job_id, i)
        try:
            if delayed:
                await task.options(delay=args.delay_s, idempotency_key=key).enqueue()
            else:
                await task.enqueue()
        except Exception as exc:  # not acknowledged (a broker too busy): counted, not owed
            failed += 1
            late.pending.pop(job_id, None)
            if failed <= 3:
                print(f"enqueue {i} failed: {exc!r}", flush=True)
            return
        chunks.of(i).enqueue_ms.append((time.perf_counter() - started) * 1000)

    await open_loop(args.jobs, args.rate, one)
    return failed


async def sample_every(
    cluster: SoakCluster,
    chunks: Chunks,
    late: Lateness,
    samples: list[Sample],
    stop: asyncio.Event,
) -> None:
    started = time.monotonic()
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), cluster.args.sample_s)
        sent = sum(len(c.enqueue_ms) for c in chunks.chunks.values())
        values = await asyncio.to_thread(cluster.sample)
        samples.append(Sample(round(time.monotonic() - started, 1), sent, values))
        shown = " ".join(f"{k}={v:.1f}" for k, v in values.items())
        print(f"sample t={samples[-1].at_s:.0f}s sent={sent} {shown} {late.drain()}", flush=True)


async def succeeded_at_least(cluster: SoakCluster, count: int, timeout_s: float) -> None:
    async def done() -> bool:
        try:
            found = await asyncio.to_thread(cluster.metrics)
        except OSError:
            return False  # the API is not listening yet
        return found["succeeded"] >= count

    deadline = time.monotonic() + timeout_s
    while not await done():
        cluster.poll_logs()  # raises when a process exited
        if time.monotonic() > deadline:
            raise TimeoutError(f"fewer than {count} jobs succeeded after {timeout_s:.0f} s")
        await asyncio.sleep(1)


async def run(cluster: SoakCluster) -> dict[str, Any]:
    a = cluster.args
    await ensure_topics(
        cluster.bootstrap, cluster.namespace, event_partitions=a.partitions, queues=["default"]
    )
    cluster.start_engine()
    cluster.start_api()
    chunks, samples = Chunks(a.chunk), []
    late = Lateness(chunks)
    stop_follow, stop_sampling = asyncio.Event(), asyncio.Event()
    following = asyncio.create_task(follow(cluster.settings, late, stop_follow))
    async with App(cluster.settings, name="soak-client") as client:
        task = define_noop(client)
        await wait_for(cluster, cluster.all_owned, 300, "nodes to own every partition")
        # The API's start (imports, its replica's catch-up) takes a core for tens of seconds:
        # jobs offered meanwhile measured the start, not the soak.
        await wait_for(cluster, cluster.api_ready, 300, "the API to be ready")
        warm = 100 * a.workers
        await asyncio.gather(*(task.enqueue() for _ in range(warm)))
        await succeeded_at_least(cluster, warm, 300)
        sampling = asyncio.create_task(sample_every(cluster, chunks, late, samples, stop_sampling))
        started = time.monotonic()
        failed = await offer(task, a, chunks, late)
        load_s = time.monotonic() - started
        stop_sampling.set()
        await sampling
    await succeeded_at_least(cluster, warm + a.jobs - failed, 600)
    deadline = time.monotonic() + 120
    while True:  # the delayed jobs' starts, folded by the follower
        if not late.pending or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.5)
    stop_follow.set()
    await following
    warmup_s = a.warmup_s if a.warmup_s is not None else 2.5 * a.retention_s
    return {
        "jobs": a.jobs,
        "rate": a.rate,
        "enqueue_failed": failed,
        "achieved_rate": round(a.jobs / load_s),
        "retention_s": a.retention_s,
        "samples": len(samples),
        "warmup_s": warmup_s,
        "unstarted_delayed": len(late.pending),
        **report(samples, chunks, warmup_s),
    }


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add = p.add_argument
    add("--jobs", type=int, default=3_000_000)
    add("--rate", type=float, default=DEFAULT_RATE, help="jobs offered per second")
    add("--retention-s", type=float, default=120.0, help="log time a finished job is kept")
    add("--chunk", type=int, default=1_000_000, help="jobs per percentile row")
    add("--sample-s", type=float, default=15.0, help="seconds between resource samples")
    add("--warmup-s", type=float, help="samples before this are not judged (2.5 retentions)")
    add("--delayed-share", type=float, default=0.2)
    add("--delay-s", type=float, default=2.0)
    add("--nodes", type=int, default=1)
    add("--workers", type=int, default=1)
    add("--partitions", type=int, default=6)
    add("--concurrency", type=int, default=100, help="attempts per worker at once")
    add("--bootstrap", help="use this broker instead of starting one")
    add("--broker-pid", type=int, help="with --bootstrap: the broker's pid (unused here)")
    add("--api-port", type=int, help="the API's port (default: a free one)")
    add("--keep", action="store_true", help="keep the run directory (logs, indexes)")
    return p.parse_args(argv)


def main() -> None:
    args = parse()
    # The cluster's own option names (bench/e2e.py); the soak has no profiling or RSS stages.
    args.profile, args.rss = None, False
    run_dir = Path(tempfile.mkdtemp(prefix="evsched-soak-"))
    cluster = SoakCluster(args, run_dir)
    started = time.monotonic()
    try:
        cluster.start_broker()
        print(f"namespace {cluster.namespace} on {cluster.bootstrap}, logs in {run_dir}")
        figures = asyncio.run(run(cluster))
    finally:
        cluster.stop()
        if not args.keep:
            shutil.rmtree(run_dir, ignore_errors=True)
    figures["wall_s"] = round(time.monotonic() - started)
    figures["load_avg_1m"] = round(os.getloadavg()[0], 2)
    print(" ".join(f"{k}={v}" for k, v in figures.items()))


if __name__ == "__main__":
    main()
