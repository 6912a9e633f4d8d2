"""The broker's process on this machine: ports, the pid file, and stopping only our own java."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

from evsched.devstack.config import HOST
from evsched.devstack.errors import BrokerFailed

_POLL_S = 0.1


class Deadline:
    """A point in time on the monotonic clock, to wait on conditions instead of sleeping."""

    def __init__(self, seconds: float) -> None:
        self._end = time.perf_counter() + seconds

    @property
    def remaining_s(self) -> float:
        return max(0.0, self._end - time.perf_counter())

    @property
    def expired(self) -> bool:
        return self.remaining_s == 0.0


def port_in_use(port: int, host: str = HOST) -> bool:
    """True when something else holds ``host:port`` (a listener, not a TIME_WAIT leftover)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # Java binds with SO_REUSEADDR too, so only a real listener blocks the broker.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return True
    return False


def free_port(host: str = HOST) -> int:
    """A port the kernel just handed out as free (for tests that start their own broker)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def port_accepts(port: int, host: str = HOST, timeout_s: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def read_pid(pid_file: Path) -> int | None:
    try:
        text = pid_file.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        return None
    return int(text) if text.isdigit() and int(text) > 0 else None


def write_pid(pid_file: Path, pid: int) -> None:
    partial = pid_file.with_suffix(".tmp")
    partial.write_text(f"{pid}\n", encoding="utf-8")
    partial.replace(pid_file)


def proc_state(stat_path: Path) -> str | None:
    """The state letter in a process's or a thread's stat file; None when it is gone.

    ``/proc/<pid>/stat`` for a process, ``/proc/<pid>/task/<tid>/stat`` for one of its threads.
    """
    try:
        stat = stat_path.read_text(encoding="utf-8")
    except (FileNotFoundError, ProcessLookupError):
        return None
    # The command name in parentheses may itself hold spaces and parentheses.
    return stat.rpartition(")")[2].split()[0]


def is_alive(pid: int) -> bool:
    """True while ``pid`` runs; a zombie (exited, not yet reaped) counts as gone."""
    state = proc_state(Path(f"/proc/{pid}/stat"))
    return state is not None and state not in {"Z", "X"}


def cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (FileNotFoundError, ProcessLookupError):
        return []
    return [arg.decode(errors="replace") for arg in raw.split(b"\0") if arg]


def is_our_broker(pid: int, server_properties: Path) -> bool:
    """True when ``pid`` is a live ``kafka.Kafka`` JVM started with our config file."""
    args = cmdline(pid)
    return is_alive(pid) and "kafka.Kafka" in args and str(server_properties) in args


def wait_gone(pid: int, timeout_s: float, child: subprocess.Popen[bytes] | None = None) -> bool:
    """Wait until ``pid`` exits; reap it when it is our child, so no zombie stays behind."""
    deadline = Deadline(timeout_s)
    while True:
        if child is not None:
            try:
                child.wait(timeout=min(_POLL_S, deadline.remaining_s))
                return True
            except subprocess.TimeoutExpired:
                pass
        elif not is_alive(pid):
            return True
        else:
            time.sleep(_POLL_S)
        if deadline.expired:
            return False


def terminate(pid: int, timeout_s: float, child: subprocess.Popen[bytes] | None = None) -> None:
    """SIGTERM, wait up to ``timeout_s``, then SIGKILL; BrokerFailed if it still lives."""
    for sig, wait_s in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, 10.0)):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
        if wait_gone(pid, wait_s, child):
            return
    raise BrokerFailed(f"broker pid {pid} survived SIGKILL")
