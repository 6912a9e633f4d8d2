"""One Kafka node (broker + controller) run from Maven Central jars: ``LocalBroker(...).up()``."""

from __future__ import annotations

import contextlib
import fcntl
import subprocess
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from evsched.devstack.config import (
    HOST,
    BrokerFiles,
    default_cache_root,
    default_data_dir,
    read_ports,
    write_broker_config,
)
from evsched.devstack.errors import BrokerFailed, DevstackError, PortInUse
from evsched.devstack.process import (
    Deadline,
    is_our_broker,
    port_accepts,
    port_in_use,
    read_pid,
    terminate,
    write_pid,
)
from evsched.devstack.readiness import metadata_answers, run_sync
from evsched.devstack.toolchain import (
    JAVA_HINT,
    KafkaDist,
    copy_storage,
    ensure_jars,
    ensure_storage_template,
    kafka_version,
    require_tool,
)
from evsched.settings import DEFAULT_BROKER_PORT, DEFAULT_CONTROLLER_PORT

# A fixed 1 GB heap and ZGC: with G1 on this size of machine the broker paused for 10-30 ms at
# every young collection (about once a second under load), and each pause stalled every producer
# at once; that was the tail of enqueue latency (docs/bench-log.md). docker-compose.yml's broker
# uses the same (a test keeps them in step).
JVM_HEAP_AND_GC = ("-Xms1g", "-Xmx1g", "-XX:+UseZGC")
# Three nodes of a local cluster share 2 cores and 24 GB with everything else: half each.
CLUSTER_HEAP_AND_GC = ("-Xms512m", "-Xmx512m", "-XX:+UseZGC")
_JVM_FLAGS = ("-XX:+ExitOnOutOfMemoryError", "-Djava.awt.headless=true")


@dataclass(frozen=True, slots=True, kw_only=True)
class BrokerStatus:
    """What ``up`` did or ``status`` found; ``as_dict`` is the CLI's ``--json`` output."""

    running: bool
    bootstrap: str
    pid: int | None
    data_dir: Path
    version: str
    started_in_s: float | None = None
    already_running: bool = False

    def as_dict(self) -> dict[str, object]:
        return {**asdict(self), "data_dir": str(self.data_dir)}


def _tail(path: Path, lines: int = 15) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return ""
    return "\n".join(text.strip().splitlines()[-lines:])


class LocalBroker:
    """One combined broker + controller on loopback whose files all live in ``data_dir``.

    Alone by default; a node of a cluster (evsched.devstack.cluster) with ``node_id``,
    ``voters`` and ``brokers``.
    """

    def __init__(
        self,
        data_dir: Path | None = None,
        port: int = DEFAULT_BROKER_PORT,
        controller_port: int = DEFAULT_CONTROLLER_PORT,
        *,
        version: str | None = None,
        cache_root: Path | None = None,
        ready_timeout_s: float = 90.0,
        stop_timeout_s: float = 30.0,
        node_id: int = 1,
        voters: str | None = None,
        brokers: int = 1,
        jvm_heap_and_gc: tuple[str, ...] = JVM_HEAP_AND_GC,
    ) -> None:
        # Absolute, because `down` recognises our JVM by the config path on its command line.
        self.files = BrokerFiles(data_dir=(data_dir or default_data_dir()).absolute())
        self.dist = KafkaDist(
            version=version or kafka_version(), cache_root=cache_root or default_cache_root()
        )
        self.port = port
        self.controller_port = controller_port
        self.ready_timeout_s = ready_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.node_id = node_id
        self.voters = voters
        self.brokers = brokers
        self.jvm_heap_and_gc = jvm_heap_and_gc
        self._child: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        return f"{HOST}:{self.port}"

    def up(self) -> BrokerStatus:
        """Start the broker and wait until it answers, or report the one already running."""
        started = time.perf_counter()
        with self._locked():
            running = self._running_pid()
            if running is not None:
                return self._status(running, already_running=True)
            child = self.start()
            self.await_ready(child, Deadline(self.ready_timeout_s))
        elapsed = round(time.perf_counter() - started, 2)
        return self._status(child.pid, started_in_s=elapsed)

    def start(self) -> subprocess.Popen[bytes]:
        """Prepare (jars, storage, config) and spawn the JVM without waiting for it to answer.

        A cluster starts every node before waiting: no node answers before a quorum of them runs.
        """
        if self._child is not None:
            # A previous JVM of ours that was killed: reap it before its Popen is dropped.
            self._child.poll()
            self._child = None
        java = require_tool("java", JAVA_HINT)
        for port in (self.port, self.controller_port):
            if port_in_use(port):
                raise PortInUse(port)
        self._check_version()
        ensure_jars(self.dist)
        self._prepare(java)
        self.files.version_file.write_text(self.dist.version, encoding="utf-8")
        return self._spawn(java)

    def await_ready(self, child: subprocess.Popen[bytes], deadline: Deadline) -> None:
        """Wait until the broker answers; on failure or ^C stop it and raise."""
        try:
            self._await_ready(child, deadline)
        except BaseException:
            # ^C or a crash while waiting: don't leave a half-started broker behind.
            if child.poll() is None:
                terminate(child.pid, 10.0, child)
            self.files.pid_file.unlink(missing_ok=True)
            raise

    def _check_version(self) -> None:
        # Storage formatted by one major is not started by another: say so instead of a trace.
        try:
            formatted = self.files.version_file.read_text(encoding="utf-8").strip()
        except FileNotFoundError:
            return
        if formatted != self.dist.version and (self.files.log_dir / "meta.properties").exists():
            raise DevstackError(
                f"{self.files.data_dir} holds Kafka {formatted}'s data, not {self.dist.version}'s: "
                "start that version, or use another --data-dir"
            )

    def down(self) -> int | None:
        """Stop our broker (SIGTERM, SIGKILL after a deadline); its pid, or None if none ran."""
        if not self.files.data_dir.is_dir():
            return None
        with self._locked():
            pid = self._running_pid()
            if pid is None:
                return None
            terminate(pid, self.stop_timeout_s, self._own_child(pid))
            self.files.pid_file.unlink(missing_ok=True)
            self._child = None
            return pid

    def status(self) -> BrokerStatus:
        running = self._running_pid() if self.files.data_dir.is_dir() else None
        return self._status(running)

    def _status(
        self, pid: int | None, *, started_in_s: float | None = None, already_running: bool = False
    ) -> BrokerStatus:
        # A written config tells where this data dir's broker listens, whatever flags say now.
        port, _ = read_ports(self.files.server_properties) or (self.port, self.controller_port)
        return BrokerStatus(
            running=pid is not None,
            bootstrap=f"{HOST}:{port}",
            pid=pid,
            data_dir=self.files.data_dir,
            version=self.recorded_version,
            started_in_s=started_in_s,
            already_running=already_running,
        )

    @property
    def recorded_version(self) -> str:
        """The version this data dir was last started with, else the one asked for."""
        try:
            return self.files.version_file.read_text(encoding="utf-8").strip() or self.dist.version
        except FileNotFoundError:
            return self.dist.version

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        # Two `up`s at once on one data dir would race for the ports and the pid file.
        self.files.data_dir.mkdir(parents=True, exist_ok=True)
        with self.files.lock_file.open("a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield

    def _running_pid(self) -> int | None:
        """The pid in our pid file if it is still our broker; a stale pid file is removed."""
        pid = read_pid(self.files.pid_file)
        if pid is None:
            return None
        if is_our_broker(pid, self.files.server_properties):
            return pid
        self.files.pid_file.unlink(missing_ok=True)
        return None

    def _prepare(self, java: str) -> None:
        """Write the configs and give the data dir formatted storage (a copy of the template)."""
        ensure_storage_template(self.dist, java, self.brokers)
        write_broker_config(
            self.files,
            port=self.port,
            controller_port=self.controller_port,
            node_id=self.node_id,
            voters=self.voters,
            brokers=self.brokers,
            log4j2=self.dist.log4j2,
        )
        copy_storage(self.dist, self.files.log_dir, self.node_id, self.brokers)

    def _client_options(self) -> dict[str, Any]:
        """What a client needs besides the address to ask this broker for metadata."""
        return {}

    def _own_child(self, pid: int) -> subprocess.Popen[bytes] | None:
        return self._child if self._child is not None and self._child.pid == pid else None

    def _spawn(self, java: str) -> subprocess.Popen[bytes]:
        command = [
            java, *self.jvm_heap_and_gc, *_JVM_FLAGS,
            *self.dist.logging_args(self.files.log4j_properties),
            "-cp", self.dist.classpath, "kafka.Kafka", str(self.files.server_properties),
        ]  # fmt: skip
        with self.files.console_log.open("ab") as console:
            # A new session: the broker outlives this process and ignores its terminal's ^C.
            child = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=console,
                stderr=subprocess.STDOUT,
                cwd=self.files.data_dir,
                start_new_session=True,
            )
        write_pid(self.files.pid_file, child.pid)
        self._child = child
        return child

    def _await_ready(self, child: subprocess.Popen[bytes], deadline: Deadline) -> None:
        while child.poll() is None and not deadline.expired:
            if port_accepts(self.port) and run_sync(
                metadata_answers(self.bootstrap, **self._client_options())
            ):
                return
            time.sleep(0.2)
        if child.poll() is None:
            terminate(child.pid, 10.0, child)
            why = f"did not answer on {self.bootstrap} within {self.ready_timeout_s:.0f} s"
        else:
            why = f"exited with code {child.returncode} before answering on {self.bootstrap}"
        self.files.pid_file.unlink(missing_ok=True)
        self._child = None
        logs = _tail(self.files.server_log) or _tail(self.files.console_log)
        raise BrokerFailed(f"the broker {why}; logs in {self.files.server_log.parent}:\n{logs}")
