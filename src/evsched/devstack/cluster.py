"""A local KRaft cluster of several combined broker + controller nodes, each a ``LocalBroker``.

The cluster's data dir holds ``cluster.json`` (size, version, ports) and ``broker-<id>/`` per node;
``status`` and ``down`` read the layout from it, whatever flags say now. Node ``i`` (from 1) listens
on ``port + 2(i-1)`` and ``controller_port + 2(i-1)``: with the defaults 19092..19097.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from evsched.devstack.broker import CLUSTER_HEAP_AND_GC, BrokerStatus, LocalBroker
from evsched.devstack.config import HOST, default_data_dir
from evsched.devstack.errors import BrokerFailed, DevstackError
from evsched.devstack.process import Deadline
from evsched.devstack.readiness import broker_count, run_sync
from evsched.devstack.toolchain import kafka_version
from evsched.settings import DEFAULT_BROKER_PORT, DEFAULT_CONTROLLER_PORT

LAYOUT_FILE = "cluster.json"
MAX_BROKERS = 9  # a loopback cluster on one machine; more is a mistake, not a test


@dataclass(frozen=True, slots=True, kw_only=True)
class ClusterStatus:
    """What ``up`` did or ``status`` found for every node; ``as_dict`` is the ``--json`` output."""

    brokers: tuple[BrokerStatus, ...]
    data_dir: Path
    version: str
    started_in_s: float | None = None
    already_running: bool = False

    @property
    def running(self) -> bool:
        return all(b.running for b in self.brokers)

    @property
    def bootstrap(self) -> str:
        """Every node's address, comma-separated: what EVSCHED_KAFKA_BOOTSTRAP takes."""
        return ",".join(b.bootstrap for b in self.brokers)

    @property
    def pids(self) -> list[int | None]:
        return [b.pid for b in self.brokers]

    def as_dict(self) -> dict[str, object]:
        return {
            "running": self.running,
            "bootstrap": self.bootstrap,
            "bootstrap_servers": [b.bootstrap for b in self.brokers],
            "pids": self.pids,
            "data_dir": str(self.data_dir),
            "version": self.version,
            "started_in_s": self.started_in_s,
            "already_running": self.already_running,
            "brokers": [b.as_dict() for b in self.brokers],
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class Layout:
    """What ``cluster.json`` records: the cluster's size, version and every node's ports."""

    version: str
    ports: tuple[tuple[int, int], ...]

    @classmethod
    def read(cls, path: Path) -> Layout | None:
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        ports = tuple((int(p), int(c)) for p, c in raw["ports"])
        return cls(version=str(raw["version"]), ports=ports)

    def write(self, path: Path) -> None:
        layout = {"brokers": len(self.ports), "version": self.version, "ports": self.ports}
        path.write_text(json.dumps(layout) + "\n", encoding="utf-8")


def is_cluster_dir(data_dir: Path | None) -> bool:
    """True when ``data_dir`` (or the default one) holds a cluster rather than one broker."""
    return ((data_dir or default_data_dir()).absolute() / LAYOUT_FILE).is_file()


def node_ports(port: int, controller_port: int, brokers: int) -> list[tuple[int, int]]:
    """Each node's (client, controller) ports; DevstackError when two of them collide."""
    if not 1 <= brokers <= MAX_BROKERS:
        raise DevstackError(f"--brokers {brokers}: expected 1 to {MAX_BROKERS}")
    ports = [(port + 2 * i, controller_port + 2 * i) for i in range(brokers)]
    flat = [p for pair in ports for p in pair]
    if len(set(flat)) != len(flat) or max(flat) > 65535:
        raise DevstackError(
            f"ports {port} and {controller_port} give nodes colliding ports {flat} "
            "(node i listens on port+2(i-1) and controller-port+2(i-1))"
        )
    return ports


class LocalCluster:
    """``brokers`` KRaft nodes on loopback, every one a voter of the controller quorum."""

    def __init__(
        self,
        data_dir: Path | None = None,
        port: int = DEFAULT_BROKER_PORT,
        controller_port: int = DEFAULT_CONTROLLER_PORT,
        *,
        brokers: int = 3,
        version: str | None = None,
        cache_root: Path | None = None,
        ready_timeout_s: float = 120.0,
        stop_timeout_s: float = 30.0,
        ports: Sequence[tuple[int, int]] | None = None,
    ) -> None:
        """``ports`` (client, controller) per node replace the ones derived from ``port``."""
        self.data_dir = (data_dir or default_data_dir()).absolute()
        self.ready_timeout_s = ready_timeout_s
        recorded = Layout.read(self.data_dir / LAYOUT_FILE)
        if recorded is not None and version is not None and recorded.version != version:
            raise DevstackError(
                f"{self.data_dir} holds a Kafka {recorded.version} cluster, not {version}: "
                "start that version, or use another --data-dir"
            )
        self.layout = recorded or Layout(
            version=version or kafka_version(),
            ports=tuple(ports or node_ports(port, controller_port, brokers)),
        )
        self.version = self.layout.version
        pairs = self.layout.ports
        voters = ",".join(f"{i}@{HOST}:{c}" for i, (_, c) in enumerate(pairs, start=1))
        self.nodes = [
            LocalBroker(
                self.data_dir / f"broker-{node_id}",
                client_port,
                control_port,
                version=self.version,
                cache_root=cache_root,
                ready_timeout_s=ready_timeout_s,
                stop_timeout_s=stop_timeout_s,
                node_id=node_id,
                voters=voters,
                brokers=len(pairs),
                jvm_heap_and_gc=CLUSTER_HEAP_AND_GC,
            )
            for node_id, (client_port, control_port) in enumerate(pairs, start=1)
        ]

    @property
    def bootstrap(self) -> str:
        return ",".join(node.bootstrap for node in self.nodes)

    def up(self) -> ClusterStatus:
        """Start every node that is not running, then wait until all of them are in the cluster."""
        started = time.perf_counter()
        with self._locked():
            stopped = [node for node in self.nodes if node.status().pid is None]
            if not stopped:
                return self._status(already_running=True)
            self.layout.write(self.data_dir / LAYOUT_FILE)
            children = []
            try:
                for node in stopped:
                    children.append((node, node.start()))
            except BaseException:
                self._stop(node for node, _ in children)
                raise
            deadline = Deadline(self.ready_timeout_s)
            for node, child in children:
                node.await_ready(child, deadline)
            self._await_members(deadline)
        return self._status(started_in_s=round(time.perf_counter() - started, 2))

    def down(self) -> list[int]:
        """Stop every node at once (one by one, the last would wait for a lost quorum)."""
        if not self.data_dir.is_dir():
            return []
        with self._locked():
            return self._stop(self.nodes)

    def status(self) -> ClusterStatus:
        return self._status()

    def node(self, node_id: int) -> LocalBroker:
        """One node, by its KRaft id (from 1): for tests that kill, freeze or restart it."""
        return self.nodes[node_id - 1]

    def _stop(self, nodes: Iterator[LocalBroker] | list[LocalBroker]) -> list[int]:
        chosen = list(nodes)
        if not chosen:
            return []
        with ThreadPoolExecutor(max_workers=len(chosen)) as pool:
            stopped = list(pool.map(lambda node: node.down(), chosen))
        return [pid for pid in stopped if pid is not None]

    def _await_members(self, deadline: Deadline) -> None:
        # Each node answering is not enough: a topic with 3 replicas needs 3 registered brokers,
        # and every node must list them (ci18: asked through a node whose metadata still listed
        # two, the first topic got two replicas and min ISR 1).
        while not deadline.expired:
            if all(
                run_sync(broker_count(node.bootstrap)) >= len(self.nodes) for node in self.nodes
            ):
                return
            time.sleep(0.2)
        self._stop(self.nodes)
        raise BrokerFailed(
            f"the cluster's {len(self.nodes)} brokers did not all register within "
            f"{self.ready_timeout_s:.0f} s; logs in {self.data_dir}/broker-*/logs"
        )

    def _status(
        self, *, started_in_s: float | None = None, already_running: bool = False
    ) -> ClusterStatus:
        return ClusterStatus(
            brokers=tuple(node.status() for node in self.nodes),
            data_dir=self.data_dir,
            version=self.version,
            started_in_s=started_in_s,
            already_running=already_running,
        )

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if (self.data_dir / "server.properties").exists():
            raise DevstackError(
                f"{self.data_dir} holds a single broker: stop it (`evsched kafka down`) and use "
                "another --data-dir for a cluster"
            )
        with (self.data_dir / ".lock").open("a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield
