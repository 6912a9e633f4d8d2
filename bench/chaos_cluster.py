"""The chaos soak's processes: its own broker, nodes and workers, and the faults dealt to them.

Builds on bench/e2e.py's ``Cluster`` (namespace, environment, log following, CPU figures) and
adds what a soak needs: a broker started here on free loopback ports that can be SIGKILLed and
started again on the same data; nodes and workers that are SIGKILLed (and restarted, so their
number stays) or frozen with SIGSTOP past their lease and thawed with SIGCONT; and a ``Fault``
record of every kill (the node's partitions, the worker's id) for the stall figures. Everything
is stopped by its own pid; nothing here touches a process it did not start.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chaos_audit import Fault
from e2e import Cluster, Proc, _script, _wait_or_kill
from evsched.devstack.broker import LocalBroker
from evsched.devstack.process import free_port, wait_gone

HERE = Path(__file__).resolve().parent


def now_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass
class Soak(Cluster):
    """One soak's broker and engine; ``faults`` lists every kill in the order they happened."""

    broker: LocalBroker | None = None
    faults: list[Fault] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)
    rng: random.Random = field(default_factory=random.Random)
    _generation: int = 0
    _frozen: set[int] = field(default_factory=set)
    _killed: set[int] = field(default_factory=set)

    def start_broker(self) -> None:
        self.broker = LocalBroker(self.run_dir / "broker", free_port(), free_port())
        status = self.broker.up()
        self.bootstrap, self.broker_pid = status.bootstrap, status.pid

    def spawn_node(self, i: int) -> Proc:
        command = [_script("evsched"), "node", "--data-dir", str(self.node_dir(i))]
        command += ["--node-id", f"n{i}", "--dispatch-timeout-s", str(self.args.dispatch_timeout_s)]
        command += ["--max-in-flight", str(self.args.max_in_flight)]
        if self.args.max_unstarted is not None:
            command += ["--max-unstarted", str(self.args.max_unstarted)]
        if self.args.standby:
            command += ["--standby"]
        return self._spawn_proc(f"node-{i}", command)

    def node_dir(self, i: int) -> Path:
        return self.run_dir / f"node-{i}"

    def spawn_worker(self, i: int) -> Proc:
        command = [_script("evsched"), "worker", "--app", "chaos_app:app"]
        command += ["--concurrency", str(self.args.concurrency), "--grace-s", "5"]
        command += ["--lease-s", str(self.args.lease_s)]
        return self._spawn_proc(f"worker-{i}", command, cwd=HERE)

    def _spawn_proc(self, name: str, command: list[str], cwd: Path | None = None) -> Proc:
        self._generation += 1
        log_path = self.run_dir / f"{name}.{self._generation}.log"
        with log_path.open("wb") as log:
            popen = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, env=self.env(), cwd=cwd
            )
        return Proc(name, popen, log_path)

    def start_engine(self) -> None:
        for i in range(1, self.args.nodes + 1):
            self.nodes.append(self.spawn_node(i))
            self.owned[f"node-{i}"] = set()
        for i in range(1, self.args.workers + 1):
            self.workers.append(self.spawn_worker(i))

    def poll_logs(self) -> None:
        """Follow the nodes' logs for the partitions each owns (workers' logs are not read)."""
        for proc in self.nodes:
            for line in proc.new_lines():
                event = line.get("event")
                if event == "partition_assigned":
                    self.owned[proc.name].add(int(line["partition"]))
                elif event == "partition_revoked":
                    self.owned[proc.name].discard(int(line["partition"]))

    def revive(self) -> None:
        """Start again a node or worker that exited by itself (not one we killed): counted."""
        for group, spawn in ((self.nodes, self.spawn_node), (self.workers, self.spawn_worker)):
            for i, proc in enumerate(group):
                if proc.popen.poll() is not None and proc.pid not in self._killed:
                    print(f"{proc.name} exited by itself ({proc.popen.returncode}): restarted")
                    self._count("unexpected_exits")
                    group[i] = spawn(i + 1)

    def _count(self, what: str) -> None:
        self.counts[what] = self.counts.get(what, 0) + 1

    async def kill_node(self) -> None:
        """SIGKILL a node; it comes back on the same data dir after ``--node-down-s``."""
        i = self.rng.randrange(len(self.nodes))
        proc = self.nodes[i]
        self.poll_logs()
        partitions = frozenset(self.owned[proc.name])
        self._killed.add(proc.pid)
        _kill(proc)
        self.faults.append(Fault("node", now_ms(), partitions=partitions))
        self._count("node_kills")
        self.owned[proc.name] = set()
        await asyncio.sleep(self.args.node_down_s)
        self.nodes[i] = self.spawn_node(i + 1)

    async def kill_worker(self) -> None:
        """SIGKILL a worker (frozen or not) and start a fresh one in its place."""
        i = self.rng.randrange(len(self.workers))
        proc = self.workers[i]
        worker_id = worker_id_prefix(proc)
        self._killed.add(proc.pid)
        _kill(proc)
        self._frozen.discard(proc.pid)
        self.faults.append(Fault("worker", now_ms(), worker_id=worker_id))
        self._count("worker_kills")
        self.workers[i] = self.spawn_worker(i + 1)

    async def freeze_worker(self) -> None:
        """SIGSTOP a worker for ``--freeze-s`` (past its lease), then SIGCONT it."""
        proc = self.rng.choice(self.workers)
        if proc.popen.poll() is not None or proc.pid in self._frozen:
            return
        os.kill(proc.pid, signal.SIGSTOP)
        self._frozen.add(proc.pid)
        self._count("worker_freezes")
        await asyncio.sleep(self.args.freeze_s)
        if proc.pid in self._frozen and proc.popen.poll() is None:
            os.kill(proc.pid, signal.SIGCONT)
        self._frozen.discard(proc.pid)

    async def kill_broker(self) -> None:
        """SIGKILL our broker, leave it down ``--broker-down-s``, start it on the same data."""
        assert self.broker is not None and self.broker_pid is not None
        os.kill(self.broker_pid, signal.SIGKILL)
        # Our own child (LocalBroker spawned it here): reaped, so no zombie looks alive.
        child = self.broker._own_child(self.broker_pid)
        await asyncio.to_thread(wait_gone, self.broker_pid, 30.0, child)
        self._count("broker_kills")
        await asyncio.sleep(self.args.broker_down_s)
        status = await asyncio.to_thread(self.broker.up)
        self.broker_pid = status.pid

    def stop_engine(self) -> None:
        """SIGCONT then SIGTERM every worker and node we started, by pid; SIGKILL if stuck."""
        for group in (self.workers, self.nodes):
            for proc in group:
                if proc.popen.poll() is None:
                    proc.popen.send_signal(signal.SIGCONT)
                    proc.popen.send_signal(signal.SIGTERM)
            for proc in group:
                _wait_or_kill(proc.popen, 30)

    def stop(self) -> None:
        self.stop_engine()
        if self.broker is not None:
            self.broker.down()

    def log_counts(self) -> dict[str, int]:
        """Log lines of note over every node's and worker's log (killed ones included).

        Counted as bytes, not parsed: the workers write thousands of lines a second.
        """
        counts = dict.fromkeys([*NODE_EVENTS, *WORKER_EVENTS, "tracebacks"], 0)
        for path in sorted(self.run_dir.glob("*.log")):
            events = NODE_EVENTS if path.name.startswith("node-") else WORKER_EVENTS
            data = path.read_bytes()
            for event in events:
                counts[event] += data.count(f'"event": "{event}"'.encode())
            # At a line's start only: a handler's failure is logged with its traceback inside
            # one JSON line, and that is the soak's flaky and broken tasks doing their job.
            counts["tracebacks"] += (b"\n" + data).count(b"\nTraceback (most recent call last)")
        return counts

    def rebuild_verify(self) -> list[dict[str, Any]]:
        """``evsched rebuild --verify`` against every node's data dir: one result per partition.

        Each result has the partition, whether its digest matched, and the offsets compared;
        a rebuild that failed outright gives ``{"error": ...}``.
        """
        results: list[dict[str, Any]] = []
        for i in range(1, self.args.nodes + 1):
            live = self.node_dir(i)
            if not live.is_dir():
                continue
            command = [_script("evsched"), "rebuild", "--verify", "--live-dir", str(live)]
            command += ["--data-dir", str(self.run_dir / f"rebuild-{i}"), "--json"]
            command += ["--processes", "1"]
            done = subprocess.run(command, env=self.env(), capture_output=True, check=False)
            try:
                document = json.loads(done.stdout)
            except ValueError:
                tail = done.stderr.decode(errors="replace").strip().splitlines()[-3:]
                results.append({"node": i, "error": f"exit {done.returncode}: {tail}"})
                continue
            results += [_compared(i, p) for p in document["partitions"] if p["live_digest"]]
        return results


# Log events the soak counts: a partition that failed a step or could not open, a decision
# held back, a fenced producer; a dispatch a worker refused (not signed by a node, undecodable)
# or skipped (past its start deadline, superseded, finished); a start of its own that the log
# stamped past the deadline (no handler ran).
NODE_EVENTS = (
    "partition_step_failed",
    "partition_open_failed",
    "partition_fenced",
    "decision_quarantined",
)
WORKER_EVENTS = (
    "dispatch_unauthenticated",
    "dispatch_undecodable",
    "dispatch_skipped",
    "start_after_deadline",
)


def _compared(node: int, partition: dict[str, Any]) -> dict[str, Any]:
    live = (partition["live_applied_offset"], partition["live_digest"])
    return {
        "node": node,
        "partition": partition["partition"],
        "offset": partition["applied_offset"],
        "match": (partition["applied_offset"], partition["digest"]) == live,
    }


def _kill(proc: Proc) -> None:
    """SIGKILL ``proc`` (ours, by pid) and reap it."""
    if proc.popen.poll() is None:
        proc.popen.send_signal(signal.SIGKILL)
    proc.popen.wait(30)


def worker_id_prefix(proc: Proc) -> str:
    """What every worker id of this process starts with (``default_worker_id``: host-pid-hex)."""
    return f"{socket.gethostname()}-{proc.pid}-"
