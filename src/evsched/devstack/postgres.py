"""A private PostgreSQL server from Debian's programs (``LocalPostgres(...).up()``) for tests, dev.

``initdb`` makes a throw-away cluster (trust authentication, loopback only) in ``data_dir`` and
``postgres`` serves it on ``port`` as this process's child, stopped by its pid. PostgreSQL refuses
to run as root: under euid 0 the directory is handed to the ``postgres`` system user and the
programs run as that user (so its parents must let that user through: a ``/tmp`` path does).
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from evsched.devstack.config import HOST
from evsched.devstack.errors import DevstackError, ToolMissing
from evsched.devstack.process import Deadline, port_in_use

BIN_ENV = "EVSCHED_POSTGRES_BIN"
# Debian installs each major version's server programs here, off PATH.
DEBIAN_BIN_GLOB = "/usr/lib/postgresql/*/bin"
SYSTEM_USER = "postgres"
SUPERUSER = "postgres"
INSTALL_HINT = "install Debian's postgresql package (apt-get install postgresql)"
_POLL_S = 0.05


class PostgresFailed(DevstackError):
    """The PostgreSQL server could not be prepared, started or stopped."""


@dataclass(frozen=True, slots=True)
class PostgresStatus:
    dsn: str
    pid: int
    data_dir: Path
    started_in_s: float


def postgres_bin() -> Path:
    """The folder of ``initdb`` and ``postgres``: ``EVSCHED_POSTGRES_BIN``, PATH, or Debian's."""
    configured = os.environ.get(BIN_ENV, "").strip()
    if configured:
        return Path(configured)
    on_path = shutil.which("initdb")
    if on_path:
        return Path(on_path).resolve().parent  # a symlink's target has pg_isready beside it
    found = sorted(Path("/").glob(DEBIAN_BIN_GLOB.lstrip("/")), key=_major, reverse=True)
    for folder in found:
        if (folder / "initdb").exists():
            return folder
    raise ToolMissing(f"no PostgreSQL server programs (initdb): {INSTALL_HINT}")


def _major(folder: Path) -> int:
    name = folder.parent.name
    return int(name) if name.isdigit() else 0


class LocalPostgres:
    """One PostgreSQL server on ``HOST:port`` whose files all live in ``data_dir``."""

    def __init__(
        self,
        data_dir: Path,
        port: int,
        *,
        durable: bool = True,
        ready_timeout_s: float = 60.0,
    ) -> None:
        self.data_dir = data_dir
        self.port = port
        # Tests switch fsync off (a throw-away cluster); dev and the benchmark keep the defaults.
        self.durable = durable
        self.ready_timeout_s = ready_timeout_s
        self._child: subprocess.Popen[bytes] | None = None

    @property
    def dsn(self) -> str:
        return f"postgresql://{SUPERUSER}@{HOST}:{self.port}/postgres"

    @property
    def log_file(self) -> Path:
        return self.data_dir / "server.log"

    def up(self) -> PostgresStatus:
        """initdb when the cluster is new, then start the server and wait until it answers."""
        started = time.perf_counter()
        folder = postgres_bin()
        if port_in_use(self.port):
            raise PostgresFailed(f"port {self.port} is in use by another process")
        cluster = self.data_dir / "cluster"
        if not (cluster / "PG_VERSION").exists():
            self._initdb(folder, cluster)
        self._child = self._spawn(folder, cluster)
        try:
            self._await_ready(folder, Deadline(self.ready_timeout_s))
        except BaseException:
            self.down()  # never leave a server behind that nobody will stop
            raise
        return PostgresStatus(
            dsn=self.dsn,
            pid=self._child.pid,
            data_dir=self.data_dir,
            started_in_s=round(time.perf_counter() - started, 2),
        )

    def down(self, timeout_s: float = 20.0) -> None:
        """Fast shutdown (SIGINT), then immediate (SIGQUIT) if it has not stopped in time."""
        child, self._child = self._child, None
        if child is None or child.poll() is not None:
            return
        for sig, wait_s in ((signal.SIGINT, timeout_s), (signal.SIGQUIT, 10.0)):
            with contextlib.suppress(ProcessLookupError):
                child.send_signal(sig)
            try:
                child.wait(timeout=wait_s)
                return
            except subprocess.TimeoutExpired:
                continue
        raise PostgresFailed(f"postgres pid {child.pid} did not stop")

    def _initdb(self, folder: Path, cluster: Path) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._hand_over(self.data_dir)
        argv = [
            str(folder / "initdb"), "-D", str(cluster), "-U", SUPERUSER, "--auth=trust",
            "-E", "UTF8", "--locale=C", "--no-sync",
        ]  # fmt: skip
        owner = _owner()
        done = subprocess.run(
            argv, capture_output=True, check=False, user=owner, group=owner,
            extra_groups=None if owner is None else [],
        )  # fmt: skip
        if done.returncode != 0:
            text = (done.stderr or done.stdout).decode(errors="replace").strip()[-800:]
            raise PostgresFailed(f"initdb failed in {cluster}: {text}")

    def _spawn(self, folder: Path, cluster: Path) -> subprocess.Popen[bytes]:
        settings = {
            "listen_addresses": HOST,
            "unix_socket_directories": "",
            "max_connections": "100",
            "fsync": "on" if self.durable else "off",
            "synchronous_commit": "on" if self.durable else "off",
            "full_page_writes": "on" if self.durable else "off",
        }
        argv = [str(folder / "postgres"), "-D", str(cluster), "-p", str(self.port)]
        for name, value in settings.items():
            argv += ["-c", f"{name}={value}"]
        log = self.log_file.open("ab")
        try:
            owner = _owner()
            return subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                user=owner, group=owner, extra_groups=None if owner is None else [],
            )  # fmt: skip
        finally:
            log.close()

    def _await_ready(self, folder: Path, deadline: Deadline) -> None:
        assert self._child is not None
        ready = [str(folder / "pg_isready"), "-q", "-h", HOST, "-p", str(self.port)]
        while not deadline.expired:
            if self._child.poll() is not None:
                raise PostgresFailed(f"postgres exited: {self._tail()}")
            if subprocess.run(ready, check=False).returncode == 0:
                return
            time.sleep(_POLL_S)
        self.down()
        raise PostgresFailed(
            f"postgres did not answer in {self.ready_timeout_s:g} s: {self._tail()}"
        )

    def _tail(self, lines: int = 10) -> str:
        try:
            text = self.log_file.read_text(errors="replace")
        except FileNotFoundError:
            return "(no log)"
        return " | ".join(text.strip().splitlines()[-lines:])

    @staticmethod
    def _hand_over(folder: Path) -> None:
        if os.geteuid() != 0:
            return
        try:
            owner = pwd.getpwnam(SYSTEM_USER)
        except KeyError:
            raise PostgresFailed(
                f"running as root needs the {SYSTEM_USER!r} system user: {INSTALL_HINT}"
            ) from None
        os.chown(folder, owner.pw_uid, owner.pw_gid)


def _owner() -> str | None:
    """Who runs initdb and postgres: the ``postgres`` system user when this process is root."""
    return SYSTEM_USER if os.geteuid() == 0 else None
