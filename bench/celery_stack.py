"""The Celery side's processes for the side-by-side benchmark: Redis, a Celery worker, a CPU hog.

Each is started here and stopped here by its pid (also on errors: ``stop`` is safe to call in a
``finally`` whatever started). Redis comes from the OS packages (``apt-get install redis-server``),
Celery and redis-py from the ``bench`` extra (``pip install -e '.[bench]'``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from e2e import _cpu_s, _wait_or_kill
from starts import STARTS_ENV

HERE = Path(__file__).resolve().parent
# Busy, and gone by itself within a moment once the bench is (even killed with SIGKILL).
HOG_LOOP = """
import os
parent = os.getppid()
while os.getppid() == parent:
    for _ in range(1_000_000):
        pass
"""


def _children(pid: int) -> list[int]:
    """The direct children of a process, from every one of its threads."""
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue
    return found


def tree_pids(pid: int) -> list[int]:
    """A process and all its descendants (Celery's prefork pool lives in children)."""
    pids, todo = [], [pid]
    while todo:
        current = todo.pop()
        pids.append(current)
        todo += _children(current)
    return pids


def tree_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process and its living descendants."""
    return sum(_cpu_s(p) for p in tree_pids(pid))


def _stop(popen: subprocess.Popen[bytes] | None, timeout_s: float) -> None:
    if popen is not None and popen.poll() is None:
        popen.send_signal(signal.SIGTERM)
    if popen is not None:
        _wait_or_kill(popen, timeout_s)


@dataclass
class CeleryStack:
    """A Redis server and one Celery worker (prefork), both logging into the run's folder."""

    run_dir: Path
    redis_port: int
    concurrency: int
    starts_path: Path
    redis: subprocess.Popen[bytes] | None = None
    worker: subprocess.Popen[bytes] | None = None
    worker_pids: list[int] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.redis_port}/0"

    def start(self) -> None:
        self.start_redis()
        self.start_worker()

    def start_redis(self) -> None:
        command = ["redis-server", "--port", str(self.redis_port), "--bind", "127.0.0.1"]
        command += ["--save", "", "--appendonly", "no", "--dir", str(self.run_dir)]
        with (self.run_dir / "redis.log").open("wb") as log:
            self.redis = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        self._wait_redis(30)

    def _wait_redis(self, timeout_s: float) -> None:
        import redis

        client = redis.Redis(port=self.redis_port, socket_timeout=1)
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                client.ping()
                return
            except redis.ConnectionError as exc:
                if self.redis is not None and self.redis.poll() is not None:
                    log = self.run_dir / "redis.log"
                    raise RuntimeError(f"redis-server exited: {log}") from exc
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
            finally:
                client.close()

    def start_worker(self) -> None:
        command = [sys.executable, "-m", "celery", "-A", "celery_app", "worker"]
        command += ["--pool", "prefork", "--concurrency", str(self.concurrency)]
        command += ["--loglevel", "WARNING", "--without-gossip", "--without-mingle"]
        command += ["--without-heartbeat", "--hostname", f"bench-{os.getpid()}@%h"]
        path = os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH", "")) if p)
        env = {**os.environ, "PYTHONPATH": path, "BENCH_REDIS_URL": self.url}
        env[STARTS_ENV] = str(self.starts_path)
        with (self.run_dir / "celery-worker.log").open("wb") as log:
            self.worker = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=HERE
            )

    def check(self) -> None:
        """Raise if Redis or the worker died."""
        for name, popen in (("redis-server", self.redis), ("celery worker", self.worker)):
            if popen is not None and popen.poll() is not None:
                raise RuntimeError(f"{name} exited with {popen.returncode}: logs in {self.run_dir}")

    def cpu(self) -> dict[str, float]:
        """CPU seconds so far: Redis (the broker) and the worker with its pool processes."""
        used = {"broker": 0.0, "node": 0.0, "worker": 0.0}
        if self.redis is not None:
            used["broker"] = _cpu_s(self.redis.pid)
        if self.worker is not None:
            # Pool children come and go only if they crash; remember every pid seen.
            self.worker_pids = sorted({*self.worker_pids, *tree_pids(self.worker.pid)})
            used["worker"] = sum(_cpu_s(p) for p in self.worker_pids)
        return used

    def stop(self) -> None:
        """Stop the worker (warm shutdown, its pool with it), then Redis; kill what lingers."""
        if self.worker is not None and self.worker.poll() is None:
            self.worker.send_signal(signal.SIGTERM)
            try:
                self.worker.wait(30)
            except subprocess.TimeoutExpired:
                # Children first, while the worker still holds them (their pids are not reused).
                for pid in tree_pids(self.worker.pid)[1:]:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                self.worker.kill()
                self.worker.wait()
        _stop(self.redis, 10)


@dataclass
class Hog:
    """A busy loop in its own process session, pinned to the last core: a neighbour's load."""

    popen: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.popen = subprocess.Popen(
            [sys.executable, "-c", HOG_LOOP],
            start_new_session=True,  # its own autogroup: nice and CFS see it as another tenant
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
        )
        core = max(os.sched_getaffinity(0))
        os.sched_setaffinity(self.popen.pid, {core})

    def cpu_s(self) -> float:
        return _cpu_s(self.popen.pid) if self.popen is not None else 0.0

    def stop(self) -> None:
        if self.popen is not None:
            self.popen.kill()
            self.popen.wait()
            self.popen = None
