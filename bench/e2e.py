"""End-to-end benchmark: no-op jobs through a broker, node and worker processes on this machine.

Not a test: it measures. It starts a broker (unless ``--bootstrap`` is given), makes a fresh
namespace, starts ``--nodes`` node and ``--workers`` worker processes (the ``evsched`` script),
enqueues with the client library, reads the events topic back, stops what it started by pid and
prints one final line::

    jobs_per_s=<N> enqueue_p50_ms=<x> enqueue_p99_ms=<x> lateness_p50_ms=<x> lateness_p99_ms=<x>

Phases, after a warm-up that waits until jobs complete (so the groups have settled) and then
runs ``--warmup-s`` seconds of the paced load unmeasured (a fresh broker's JIT compiler alone
takes most of a core for its first minute):

1. **paced**: ``--rate`` jobs/s for ``--paced-s`` seconds, open loop (a late enqueue never delays
   the next). Each ``await task.enqueue()`` (acks=all) is timed on the client: ``enqueue_*``.
   A ``--delayed-share`` of them get ``delay=--delay-s``; for those, start lateness is the log
   time of the applied AttemptStarted minus the job's ``run_at``: ``lateness_*``.
2. **sustained**: ``--jobs`` jobs enqueued as fast as the client can (same delayed share), then
   ``jobs_per_s`` = completed jobs / (first enqueue to the last AttemptSucceeded log time).

Log times and verdicts come from folding the events topic read back after each phase with the
core fold (so "applied" means what it means to the node). Percentiles are exact, from the sorted
samples (``statistics.quantiles``, inclusive); no histogram library.

``--rss`` instead enqueues jobs in stages (``--rss-stages 100000,1000000``) as fast as the client
can, waits after each stage until every job succeeded and the node committed everything, samples
the node's VmRSS, and ends with ``rss_mb=<a>,<b>... rss_change_pct=<x>``.

``--profile DIR`` attaches ``py-spy record`` (``pip install py-spy``) to every node and worker
for the sustained phase (or the paced one, ``--profile-phase paced``) and writes collapsed stacks
there.

Run: ``.venv/bin/python bench/e2e.py --jobs 20000 --partitions 6``. The workers import this file
as ``e2e:app``, so importing it must stay free of side effects beyond defining the app.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from aiokafka import AIOKafkaConsumer, TopicPartition

from evsched.adapters.avro import decode_event
from evsched.adapters.avro.registry import HEADER_SIZE, MAGIC, SchemaRegistry
from evsched.adapters.kafka.topics import Topics, ensure_topics
from evsched.adapters.proofs import generate_key as generate_node_key
from evsched.adapters.signing import DispatchKey
from evsched.client import App, Task
from evsched.core.events import (
    JOB_EVENT_TYPES,
    AttemptStarted,
    AttemptSucceeded,
    JobEnqueued,
    JobLeased,
    Position,
)
from evsched.core.fold import fold
from evsched.core.state import JobState, Verdict
from evsched.devstack.process import free_port
from evsched.errors import DecodeError
from evsched.settings import Settings

T = TypeVar("T")

TASK_NAME = "bench.noop"
HERE = Path(__file__).resolve().parent


def define_noop(target: App) -> Task:
    @target.task(name=TASK_NAME, max_attempts=3)
    async def noop() -> None:
        """Does nothing: the job's cost is the scheduler's alone."""

    return noop


# The app the worker processes serve (``evsched worker --app e2e:app``, run from this folder).
app = App(name="bench")
define_noop(app)


# --- processes ------------------------------------------------------------------------------


def _script(name: str) -> str:
    """A console script of this environment (the venv's bin), else from PATH."""
    script = Path(sys.executable).parent / name
    return str(script) if script.exists() else name


@dataclass
class Proc:
    """A process this benchmark started, with its log file (JSON lines on stderr)."""

    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path
    read_at: int = 0
    pending: bytes = b""

    @property
    def pid(self) -> int:
        return self.popen.pid

    def new_bytes(self) -> bytes:
        """Complete log lines written since the last call."""
        with self.log_path.open("rb") as f:
            f.seek(self.read_at)
            chunk = f.read()
        self.read_at += len(chunk)
        data = self.pending + chunk
        cut = data.rfind(b"\n") + 1
        self.pending = data[cut:]
        return data[:cut]

    def new_lines(self) -> list[dict[str, Any]]:
        """Log lines written since the last call, parsed (non-JSON lines are skipped)."""
        lines = []
        for raw in self.new_bytes().splitlines():
            with contextlib.suppress(ValueError):
                lines.append(json.loads(raw))
        return lines

    def cpu_s(self) -> float:
        return _cpu_s(self.pid)

    def rss_mb(self) -> float:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        raise RuntimeError(f"no VmRSS for {self.name}")


@dataclass
class Cluster:
    """The broker (when started here), nodes and workers of one run, in one namespace."""

    args: argparse.Namespace
    run_dir: Path
    bootstrap: str = ""
    broker_dir: Path | None = None
    broker_pid: int | None = None
    broker_pids: list[int] = field(default_factory=list)  # every node's, when started here
    namespace: str = field(default_factory=lambda: f"bench-{uuid.uuid4().hex[:10]}")
    app_ref: str = "e2e:app"  # what the workers serve, importable from this folder
    nodes: list[Proc] = field(default_factory=list)
    workers: list[Proc] = field(default_factory=list)
    spies: list[subprocess.Popen[bytes]] = field(default_factory=list)
    # AttemptSucceeded records on the events topic so far, counted by ``count_successes`` once
    # something waits for successes (progress, not the measure: figures come from ``read_back``).
    succeeded: int = 0
    counting: asyncio.Task[None] | None = None
    owned: dict[str, set[int]] = field(default_factory=dict)
    dispatch_key: str = field(default_factory=DispatchKey.generate, repr=False)
    node_key: str = field(default_factory=generate_node_key, repr=False)

    @property
    def settings(self) -> Settings:
        return Settings(
            bootstrap=self.bootstrap,
            namespace=self.namespace,
            event_partitions=self.args.partitions,
        )

    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            # Workers run in bench/: a relative PYTHONPATH=src would silently fall back to
            # whatever evsched is installed.
            "PYTHONPATH": absolute_paths(os.environ.get("PYTHONPATH", "")),
            "EVSCHED_KAFKA_BOOTSTRAP": self.bootstrap,
            "EVSCHED_NAMESPACE": self.namespace,
            "EVSCHED_EVENT_PARTITIONS": str(self.args.partitions),
            "EVSCHED_DISPATCH_KEY": self.dispatch_key,
            "EVSCHED_NODE_KEY": self.node_key,
        }

    @property
    def brokers(self) -> int:
        """``--brokers`` (benches of their own arguments start one)."""
        return int(getattr(self.args, "brokers", 1))

    def start_broker(self, port: int | None = None, controller: int | None = None) -> None:
        """Use ``--bootstrap``, else start ``--brokers`` brokers (on these ports, else free ones).

        A cluster's node i listens on port+2(i-1) and controller+2(i-1) (``evsched kafka up``).
        """
        if self.args.bootstrap:
            self.bootstrap = self.args.bootstrap
            self.broker_pid = self.args.broker_pid
            return
        self.broker_dir = self.run_dir / "broker"
        if port is None or controller is None:
            port, controller = free_port_pairs(self.brokers)
        command = [_script("evsched"), "kafka", "up", "--data-dir", str(self.broker_dir), "--json"]
        command += ["--port", str(port), "--controller-port", str(controller)]
        command += ["--brokers", str(self.brokers)]
        status = json.loads(subprocess.run(command, check=True, capture_output=True).stdout)
        self.bootstrap = status["bootstrap"]
        self.broker_pids = [int(p) for p in status.get("pids") or [status["pid"]]]
        self.broker_pid = self.broker_pids[0]

    def spawn(self, name: str, command: Sequence[str], cwd: Path | None = None) -> Proc:
        log_path = self.run_dir / f"{name}.log"
        with log_path.open("wb") as log:
            popen = subprocess.Popen(
                list(command), stdout=log, stderr=subprocess.STDOUT, env=self.env(), cwd=cwd
            )
        return Proc(name, popen, log_path)

    def start_engine(self) -> None:
        for i in range(1, self.args.nodes + 1):
            data = self.run_dir / f"node-{i}"
            command = [_script("evsched"), "node", "--data-dir", str(data), "--node-id", f"n{i}"]
            command += shlex.split(getattr(self.args, "node_args", "") or "")
            self.nodes.append(self.spawn(f"node-{i}", command))
            self.owned[f"node-{i}"] = set()
        for i in range(1, self.args.workers + 1):
            command = [_script("evsched"), "worker", "--app", self.app_ref]
            command += ["--concurrency", str(self.args.concurrency), "--grace-s", "5"]
            self.workers.append(self.spawn(f"worker-{i}", command, cwd=HERE))

    def poll_logs(self) -> None:
        """Follow the processes' logs: partitions owned, successes so far, crashes."""
        for proc in self.nodes:
            for line in proc.new_lines():
                event = line.get("event")
                if event == "partition_assigned":
                    self.owned[proc.name].add(int(line["partition"]))
                elif event == "partition_revoked":
                    self.owned[proc.name].discard(int(line["partition"]))
        if self.counting is not None and self.counting.done():
            self.counting.result()  # raises what stopped the count
        for proc in [*self.nodes, *self.workers]:
            if proc.popen.poll() is not None:
                raise RuntimeError(
                    f"{proc.name} exited with {proc.popen.returncode}: {proc.log_path}"
                )

    def all_owned(self) -> bool:
        """Every partition has an owner, and every node owns one (when there are enough)."""
        union = set().union(*self.owned.values())
        each = self.args.nodes > self.args.partitions or all(self.owned.values())
        return union == set(range(self.args.partitions)) and each

    def cpu(self) -> dict[str, float]:
        """CPU seconds used so far by each process of the run (the broker when started here)."""
        used = {p.name: p.cpu_s() for p in [*self.nodes, *self.workers]}
        if len(self.broker_pids) > 1:
            used.update({f"broker-{i}": _cpu_s(p) for i, p in enumerate(self.broker_pids, 1)})
        elif self.broker_pid is not None:
            used["broker"] = _cpu_s(self.broker_pid)
        used["bench"] = _cpu_s(os.getpid())
        used["machine"] = _machine_busy_s()
        return used

    def start_profiles(self, out: Path) -> None:
        out.mkdir(parents=True, exist_ok=True)
        for proc in [*self.nodes, *self.workers]:
            self.spies.append(py_spy(proc.pid, out / f"{proc.name}.folded"))

    def stop_profiles(self) -> None:
        for spy in self.spies:
            spy.send_signal(signal.SIGINT)
        for spy in self.spies:
            _wait_or_kill(spy, 20)
        self.spies.clear()

    def stop(self) -> None:
        """Stop everything started here, by pid: workers, nodes, then the broker."""
        self.stop_profiles()
        for group in (self.workers, self.nodes):
            for proc in group:
                if proc.popen.poll() is None:
                    proc.popen.send_signal(signal.SIGTERM)
            for proc in group:
                _wait_or_kill(proc.popen, 30)
        if self.broker_dir is not None:
            command = [_script("evsched"), "kafka", "down", "--data-dir", str(self.broker_dir)]
            subprocess.run(command, check=False, stdout=subprocess.DEVNULL)


# AttemptSucceeded as workers write it: single-object Avro, this header first.
SUCCEEDED_HEADER = MAGIC + SchemaRegistry.from_contract().current("AttemptSucceeded").fingerprint


async def count_successes(cluster: Cluster) -> None:
    """Count the AttemptSucceeded records of ``cluster``'s events topic into ``cluster.succeeded``.

    From the log rather than the workers' log lines: a worker writes no line per job at info.
    Read uncommitted (workers write outside transactions, and the nodes' open transactions
    would hold a read_committed consumer back); only the header is looked at.
    """
    settings = cluster.settings
    consumer, _ = await _events_from_start(settings)
    try:
        while True:
            batches = await consumer.getmany(timeout_ms=200, max_records=20_000)
            for raws in batches.values():
                cluster.succeeded += sum(
                    1 for raw in raws if (raw.value or b"")[:HEADER_SIZE] == SUCCEEDED_HEADER
                )
    finally:
        await consumer.stop()


def free_port_pairs(brokers: int) -> tuple[int, int]:
    """(port, controller port) whose node ports (port+2i, controller+2i) are all free now."""
    while True:
        port = free_port()
        wanted = [port + i for i in range(2 * brokers)]
        if max(wanted) <= 65535 and all(_bindable(p) for p in wanted[1:]):
            return port, port + 1


def _bindable(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


async def _events_from_start(
    settings: Settings, **options: Any
) -> tuple[AIOKafkaConsumer, list[TopicPartition]]:
    """A started consumer of every events partition, at the beginning of each."""
    topic = Topics(settings.namespace).events
    consumer = AIOKafkaConsumer(
        bootstrap_servers=settings.bootstrap,
        enable_auto_commit=False,
        fetch_max_wait_ms=50,
        max_partition_fetch_bytes=8 << 20,
        **options,
    )
    await consumer.start()
    tps = [TopicPartition(topic, p) for p in range(settings.event_partitions)]
    try:
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
    except BaseException:
        await consumer.stop()
        raise
    return consumer, tps


def absolute_paths(search_path: str) -> str:
    """A PATH-like list with every entry made absolute against the current directory."""
    return os.pathsep.join(str(Path(p).absolute()) for p in search_path.split(os.pathsep) if p)


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far (0 once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _machine_busy_s() -> float:
    """CPU seconds the whole machine spent busy so far (all cores, all processes)."""
    ticks = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = ticks[3] + ticks[4]  # idle + iowait
    return (sum(ticks[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def py_spy(pid: int, out: Path) -> subprocess.Popen[bytes]:
    """py-spy sampling ``pid`` at 200 Hz into ``out`` as folded stacks, until SIGINT."""
    command = [_script("py-spy"), "record", "-p", str(pid), "-r", "200", "--format", "raw"]
    command += ["-o", str(out)]
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _wait_or_kill(popen: subprocess.Popen[bytes], timeout_s: float) -> None:
    try:
        popen.wait(timeout_s)
    except subprocess.TimeoutExpired:
        popen.kill()
        popen.wait()


async def wait_for(cluster: Cluster, done: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        cluster.poll_logs()
        if done():
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"gave up waiting for {what} after {timeout_s:.0f} s")
        await asyncio.sleep(0.05)


async def wait_succeeded(cluster: Cluster, count: int, timeout_s: float) -> None:
    if cluster.counting is None:  # from the log's start: successes before now count too
        cluster.counting = asyncio.create_task(count_successes(cluster))
    await wait_for(cluster, lambda: cluster.succeeded >= count, timeout_s, f"{count} successes")


# --- load ---------------------------------------------------------------------------------------


@dataclass
class Sent:
    """What the client sent in one phase: job ids, which were delayed, enqueue latencies."""

    jobs: list[str] = field(default_factory=list)
    delayed: set[str] = field(default_factory=set)
    latencies_ms: list[float] = field(default_factory=list)
    first_at_ms: int = 0
    # How late the pacing woke for each job it slept for (ms): the client's event loop lag.
    late_ms: list[float] = field(default_factory=list)


def _is_delayed(i: int, share: float) -> bool:
    """Spread delayed jobs evenly: job i is delayed when the running share would fall short."""
    return int((i + 1) * share) > int(i * share)


# Enqueues job number i (delayed or not) and returns its id once the broker acknowledged it.
Submit = Callable[[int, bool], Awaitable[str]]


def noop_submit(task: Task, delay_s: float) -> Submit:
    """The no-op task's enqueue, with ``delay_s`` for the delayed jobs."""

    async def submit(i: int, delayed: bool) -> str:
        return await (task.options(delay=delay_s).enqueue() if delayed else task.enqueue())

    return submit


async def _enqueue_one(submit: Submit, sent: Sent, i: int, share: float) -> None:
    delayed = _is_delayed(i, share)
    start = time.perf_counter()
    job_id = await submit(i, delayed)
    sent.latencies_ms.append((time.perf_counter() - start) * 1000)
    sent.jobs.append(job_id)
    if delayed:
        sent.delayed.add(job_id)


async def paced(task: Task, rate: float, seconds: float, delay_s: float, share: float) -> Sent:
    """The paced load of the no-op task."""
    return await paced_with(noop_submit(task, delay_s), rate, seconds, share)


async def paced_with(
    submit: Submit, rate: float, seconds: float, share: float, tick_s: float = 0.0
) -> Sent:
    """Open-loop load: enqueue i starts at t0 + i/rate whatever earlier ones are doing (those due
    within ``tick_s`` of each other start together, see ``open_loop``)."""
    sent = Sent(first_at_ms=time.time_ns() // 1_000_000)
    one = lambda i: _enqueue_one(submit, sent, i, share)  # noqa: E731
    await open_loop(int(rate * seconds), rate, one, sent.late_ms, tick_s)
    return sent


async def open_loop(
    count: int,
    rate: float,
    one: Callable[[int], Coroutine[Any, Any, None]],
    late_ms: list[float] | None = None,
    tick_s: float = 0.0,
) -> None:
    """Start ``one(i)`` at t0 + i/rate for i < ``count``, whatever earlier ones are doing; return
    once every one has ended. The pacing sleeps at least ``tick_s`` at a time, then starts every
    job due by then (0: one sleep per job). ``late_ms`` gets how late each sleep ended: the loop's
    lag, measured by the pacing's own timers (a timer of its own would wake the loop as often)."""
    running: set[asyncio.Task[None]] = set()
    t0 = time.perf_counter()
    for i in range(count):
        now = time.perf_counter()
        due = t0 + i / rate
        if due > now:
            until = max(due, now + tick_s)
            await asyncio.sleep(until - now)
            if late_ms is not None:
                late_ms.append((time.perf_counter() - until) * 1000)
        job = asyncio.create_task(one(i))
        running.add(job)
        job.add_done_callback(running.discard)
    if running:
        await asyncio.gather(*running)


async def flood(task: Task, count: int, delay_s: float, share: float, start: int = 0) -> Sent:
    """The no-op task's jobs as fast as the client can."""
    return await flood_with(noop_submit(task, delay_s), count, share, start)


async def flood_with(submit: Submit, count: int, share: float, start: int = 0) -> Sent:
    """Enqueue ``count`` jobs as fast as the client can, many in flight at once."""
    sent = Sent(first_at_ms=time.time_ns() // 1_000_000)
    numbers = iter(range(start, start + count))

    async def lane() -> None:
        for i in numbers:
            await _enqueue_one(submit, sent, i, share)

    await asyncio.gather(*(lane() for _ in range(min(count, 1_000))))
    return sent


# --- reading the log back -------------------------------------------------------------------


@dataclass
class JobTimes:
    run_at: int = 0
    leased_at: int | None = None
    started_at: int | None = None
    succeeded_at: int | None = None


async def read_back(settings: Settings, wanted: set[str]) -> dict[str, JobTimes]:
    """Fold the whole events topic and return the times of the ``wanted`` jobs."""
    consumer, tps = await _events_from_start(settings, isolation_level="read_committed")
    try:
        ends = await consumer.end_offsets(tps)
        states: dict[str, JobState] = {}
        times: dict[str, JobTimes] = {}
        while [tp for tp in tps if await consumer.position(tp) < ends[tp]]:
            batches = await consumer.getmany(timeout_ms=500, max_records=10_000)
            for raws in batches.values():
                for raw in raws:
                    _fold_record(raw, states, times, wanted)
        return times
    finally:
        await consumer.stop()


def _fold_record(
    raw: Any, states: dict[str, JobState], times: dict[str, JobTimes], wanted: set[str]
) -> None:
    try:
        event = decode_event(raw.value or b"")
    except DecodeError:
        return
    if not isinstance(event, JOB_EVENT_TYPES) or event.job_id not in wanted:
        return
    job_id = event.job_id
    position = Position(partition=raw.partition, offset=raw.offset, log_at=raw.timestamp)
    after, entry = fold(states.get(job_id), event, position)
    if entry.verdict is not Verdict.APPLIED or after is None:
        return
    states[job_id] = after
    t = times.setdefault(job_id, JobTimes())
    if isinstance(event, JobEnqueued):
        t.run_at = after.run_at
    elif isinstance(event, JobLeased) and t.leased_at is None:
        t.leased_at = raw.timestamp
    elif isinstance(event, AttemptStarted) and t.started_at is None:
        t.started_at = raw.timestamp
    elif isinstance(event, AttemptSucceeded):
        t.succeeded_at = raw.timestamp


# --- figures ------------------------------------------------------------------------------------


def pct(values: Iterable[float], q: int) -> float:
    data = sorted(values)
    if not data:
        return float("nan")
    if len(data) == 1:
        return data[0]
    return statistics.quantiles(data, n=100, method="inclusive")[q - 1]


def lateness(sent: Sent, times: dict[str, JobTimes]) -> list[float]:
    found = [times[j] for j in sent.delayed if j in times and times[j].started_at is not None]
    return [float(t.started_at - t.run_at) for t in found if t.started_at is not None]


def report_cpu(name: str, before: dict[str, float], after: dict[str, float], wall_s: float) -> None:
    used = {k: after[k] - before.get(k, 0.0) for k in after}
    machine = used.pop("machine")
    ours = sum(used.values())
    parts = " ".join(f"{k}={v:.1f}" for k, v in used.items())
    print(
        f"{name}: cpu_s {parts} ours={ours:.1f} others={max(0.0, machine - ours):.1f} "
        f"over {wall_s:.1f} s wall ({os.cpu_count()} cores)"
    )


def report_stages(name: str, sent: Sent, times: dict[str, JobTimes]) -> None:
    """Where a delayed job's lateness comes from: due to leased (node), leased to started."""
    found = [times[j] for j in sent.delayed if j in times]
    lease = [float(t.leased_at - t.run_at) for t in found if t.leased_at is not None]
    start = [
        float(t.started_at - t.leased_at)
        for t in found
        if t.started_at is not None and t.leased_at is not None
    ]
    if lease and start:
        print(
            f"{name}: run_at to JobLeased p50={pct(lease, 50):.1f} p99={pct(lease, 99):.1f} ms; "
            f"JobLeased to AttemptStarted p50={pct(start, 50):.1f} p99={pct(start, 99):.1f} ms"
        )


def report_lateness(name: str, late: list[float]) -> None:
    negative = sum(1 for x in late if x < 0)
    if late:
        print(
            f"{name}: delayed jobs started={len(late)} lateness p50={pct(late, 50):.1f} ms "
            f"p99={pct(late, 99):.1f} ms max={max(late):.0f} ms min={min(late):.0f} ms "
            f"negative={negative}"
        )


async def phase_paced(cluster: Cluster, task: Task) -> tuple[Sent, list[float]]:
    a = cluster.args
    before, cpu, wall = cluster.succeeded, cluster.cpu(), time.monotonic()
    if a.profile and a.profile_phase == "paced":
        cluster.start_profiles(Path(a.profile))
    sent = await paced(task, a.rate, a.paced_s, a.delay_s, a.delayed_share)
    await wait_succeeded(cluster, before + len(sent.jobs), 120 + a.delay_s)
    report_cpu("paced", cpu, cluster.cpu(), time.monotonic() - wall)
    cluster.stop_profiles()
    times = await read_back(cluster.settings, set(sent.jobs))
    late = lateness(sent, times)
    lat = sent.latencies_ms
    print(
        f"paced: {len(sent.jobs)} jobs at {a.rate:.0f}/s, enqueue p50={pct(lat, 50):.2f} ms "
        f"p99={pct(lat, 99):.2f} ms max={max(lat):.1f} ms"
    )
    report_lateness("paced", late)
    report_stages("paced", sent, times)
    return sent, late


async def phase_sustained(cluster: Cluster, task: Task) -> float:
    a = cluster.args
    before, cpu, wall = cluster.succeeded, cluster.cpu(), time.monotonic()
    if a.profile and a.profile_phase == "sustained":
        cluster.start_profiles(Path(a.profile))
    sent = await flood(task, a.jobs, a.delay_s, a.delayed_share)
    enqueued_s = time.time() - sent.first_at_ms / 1000
    await wait_succeeded(cluster, before + a.jobs, a.jobs / 100 + 120)
    report_cpu("sustained", cpu, cluster.cpu(), time.monotonic() - wall)
    cluster.stop_profiles()
    times = await read_back(cluster.settings, set(sent.jobs))
    done = [t.succeeded_at for t in times.values() if t.succeeded_at is not None]
    span_s = (max(done) - sent.first_at_ms) / 1000
    rate = len(done) / span_s
    print(
        f"sustained: {len(done)}/{a.jobs} jobs succeeded in {span_s:.2f} s = {rate:.0f} jobs/s "
        f"(enqueue took {enqueued_s:.2f} s = {a.jobs / enqueued_s:.0f}/s)"
    )
    report_lateness("sustained", lateness(sent, times))
    return rate


async def warm_up(cluster: Cluster, task: Task) -> None:
    await wait_for(cluster, cluster.all_owned, 120, "nodes to own every partition")
    count = 50 * cluster.args.workers
    await flood(task, count, 0, 0)
    await wait_succeeded(cluster, count, 120)
    a = cluster.args
    if a.warmup_s > 0 and not a.rss:
        before, cpu, wall = cluster.succeeded, cluster.cpu(), time.monotonic()
        sent = await paced(task, a.rate, a.warmup_s, a.delay_s, a.delayed_share)
        await wait_succeeded(cluster, before + len(sent.jobs), 120 + a.delay_s)
        report_cpu("warm-up", cpu, cluster.cpu(), time.monotonic() - wall)
    await asyncio.sleep(2)


async def node_caught_up(cluster: Cluster) -> bool:
    """Whether the nodes' group committed offsets reached the end of every events partition."""
    settings = cluster.settings
    topic = Topics(settings.namespace).events
    consumer = AIOKafkaConsumer(
        bootstrap_servers=settings.bootstrap, group_id=f"{settings.namespace}.nodes"
    )
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(settings.event_partitions)]
        ends = await consumer.end_offsets(tps)
        for tp in tps:
            committed = await consumer.committed(tp)
            # A transaction marker follows the last record; committed offsets stop before it.
            if committed is None or committed < ends[tp] - 1:
                return False
        return True
    finally:
        await consumer.stop()


async def wait_caught_up(cluster: Cluster, timeout_s: float = 600) -> None:
    deadline = time.monotonic() + timeout_s
    while not await node_caught_up(cluster):
        if time.monotonic() > deadline:
            raise TimeoutError("the nodes did not commit up to the end of the log")
        await asyncio.sleep(0.5)


async def rss_mode(cluster: Cluster, task: Task) -> str:
    stages = [int(s) for s in cluster.args.rss_stages.split(",")]
    node = cluster.nodes[0]
    samples: list[float] = [node.rss_mb()]
    print(f"rss: after warm-up {samples[0]:.1f} MB")
    total = 0
    for stage in stages:
        chunk = stage - total
        started = time.monotonic()
        base = cluster.succeeded
        for offset in range(0, chunk, 50_000):
            # Enqueue in slices, so the backlog (and the client's memory) stays bounded.
            await flood(task, min(50_000, chunk - offset), 0, 0, start=total + offset)
            await wait_succeeded(cluster, base + offset, 3_600)
        total = stage
        await wait_succeeded(cluster, base + chunk, 3_600)
        await wait_caught_up(cluster)
        await asyncio.sleep(5)
        rss = statistics.median(node.rss_mb() for _ in range(5))
        samples.append(rss)
        elapsed = time.monotonic() - started
        print(f"rss: {total} jobs in the index: {rss:.1f} MB ({chunk / elapsed:.0f} jobs/s)")
    change = (samples[-1] - samples[1]) / samples[1] * 100
    figures = ",".join(f"{s:.1f}" for s in samples[1:])
    return f"rss_mb={figures} rss_change_pct={change:+.1f}"


async def run(cluster: Cluster) -> str:
    await ensure_topics(
        cluster.bootstrap,
        cluster.namespace,
        event_partitions=cluster.args.partitions,
        queues=["default"],
    )
    cluster.start_engine()
    client = App(cluster.settings, name="bench-client")
    task = define_noop(client)
    async with client:
        await warm_up(cluster, task)
        if cluster.args.rss:
            return await rss_mode(cluster, task)
        sent, late = await phase_paced(cluster, task)
        rate = await phase_sustained(cluster, task)
    lat = sent.latencies_ms
    negative = sum(1 for x in late if x < 0)
    if negative:
        print(f"WARNING: {negative} delayed jobs started before their run_at")
    return (
        f"jobs_per_s={rate:.0f} enqueue_p50_ms={pct(lat, 50):.2f} "
        f"enqueue_p99_ms={pct(lat, 99):.2f} lateness_p50_ms={pct(late, 50):.1f} "
        f"lateness_p99_ms={pct(late, 99):.1f}"
    )


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=20_000, help="jobs in the sustained phase")
    p.add_argument("--delayed-share", type=float, default=0.2, help="share of delayed jobs")
    p.add_argument("--delay-s", type=float, default=2.0, help="delay of the delayed jobs")
    p.add_argument("--rate", type=float, default=500.0, help="paced phase: jobs per second")
    p.add_argument("--paced-s", type=float, default=20.0, help="paced phase: duration")
    p.add_argument("--warmup-s", type=float, default=40.0, help="unmeasured paced load first")
    p.add_argument("--nodes", type=int, default=1)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--partitions", type=int, default=6)
    p.add_argument("--concurrency", type=int, default=100, help="attempts per worker at once")
    p.add_argument(
        "--brokers", type=int, default=1,
        help="brokers to start: 3 makes a KRaft cluster, topics with RF 3 and min ISR 2",
    )  # fmt: skip
    p.add_argument("--bootstrap", help="use this broker instead of starting one")
    p.add_argument("--broker-pid", type=int, help="with --bootstrap: count this pid's CPU")
    p.add_argument("--node-args", default="", help='more node options: "--max-unstarted 500"')
    p.add_argument("--rss", action="store_true", help="measure the node's RSS instead")
    p.add_argument("--rss-stages", default="100000,1000000", help="jobs in the index per sample")
    p.add_argument("--profile", help="py-spy the node and worker processes into this dir")
    p.add_argument(
        "--profile-phase", choices=["paced", "sustained"], default="sustained", help="when to"
    )
    p.add_argument("--keep", action="store_true", help="keep the run directory (logs, indexes)")
    return p.parse_args(argv)


def run_once(cluster: Cluster, measure: Callable[[Cluster], Coroutine[Any, Any, T]]) -> T:
    """Start ``cluster``'s broker, ``measure`` on it, stop everything it started (its run
    directory too, unless ``--keep``); what ``measure`` returned."""
    try:
        cluster.start_broker()
        print(f"namespace {cluster.namespace} on {cluster.bootstrap}, logs in {cluster.run_dir}")
        return asyncio.run(measure(cluster))
    finally:
        cluster.stop()
        if not cluster.args.keep:
            shutil.rmtree(cluster.run_dir, ignore_errors=True)


def main() -> None:
    args = parse()
    print(run_once(Cluster(args, Path(tempfile.mkdtemp(prefix="evsched-bench-"))), run))


if __name__ == "__main__":
    main()
