"""When each timed no-op started: the tasks append a line, the side-by-side benchmark reads them.

Both evsched's and Celery's timed no-op call ``record``, so start lateness is measured the same
way for both: the task's own clock reading when its body starts, minus the run time the client
asked for. The line is one ``os.write`` on an ``O_APPEND`` file, so processes (Celery's prefork
children) can share a file without interleaving lines.
"""

from __future__ import annotations

import functools
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

STARTS_ENV = "BENCH_STARTS_FILE"


@functools.cache
def _open(path: str) -> int:
    return os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)


def record(tag: str, run_at_ms: int) -> None:
    """Note that the job ``tag`` (``<phase>/<n>``) starts now; ``run_at_ms`` 0 when not delayed."""
    path = os.environ.get(STARTS_ENV)
    if path:
        os.write(_open(path), f"{tag} {run_at_ms} {time.time_ns()}\n".encode())


@dataclass(frozen=True, slots=True)
class Start:
    """One job's first start: the run time it asked for (0: at once) and when its body started."""

    run_at_ms: int
    started_ns: int

    @property
    def lateness_ms(self) -> float:
        return self.started_ns / 1e6 - self.run_at_ms


@dataclass
class StartLog:
    """Follows one starts file: the first start of each job, grouped by phase (the tag's prefix)."""

    path: Path
    read_at: int = 0
    pending: bytes = b""
    phases: dict[str, dict[str, Start]] = field(default_factory=dict)

    def poll(self) -> None:
        """Read the lines written since the last call (a redelivered job counts once)."""
        if not self.path.exists():
            return
        with self.path.open("rb") as f:
            f.seek(self.read_at)
            chunk = f.read()
        self.read_at += len(chunk)
        data = self.pending + chunk
        cut = data.rfind(b"\n") + 1
        self.pending = data[cut:]
        for line in data[:cut].decode().splitlines():
            self.add(line)

    def add(self, line: str) -> None:
        tag, run_at_ms, started_ns = line.split()
        phase = tag.rpartition("/")[0]
        self.phases.setdefault(phase, {}).setdefault(tag, Start(int(run_at_ms), int(started_ns)))

    def started(self, phase: str) -> list[Start]:
        return list(self.phases.get(phase, {}).values())

    def count(self, phase: str) -> int:
        return len(self.phases.get(phase, {}))
