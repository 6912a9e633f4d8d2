"""A SASL_SSL broker with the role ACLs of docs/security.md, and evsched processes run as each role.

Every process gets only the documented ``EVSCHED_KAFKA_*`` variables of its role's SASL user,
so what passes here is what an operator following docs/security.md would see.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from tests.conftest import _in_ci, unique_name
from tests.integration.engine import REPO

from evsched.adapters.proofs import generate_key as generate_node_key
from evsched.adapters.signing import DispatchKey
from evsched.devstack.acls import ROLES, role_acls
from evsched.devstack.errors import DevstackError
from evsched.devstack.process import port_in_use
from evsched.devstack.secure import SecureBroker

# This suite's ports (19700-19749 are reserved for it on shared machines).
PORTS = range(19710, 19750)
APP = "tests.integration.scenario_app:app"
PROCESS_TIMEOUT_S = 180.0


def free_ports(count: int) -> list[int]:
    found = [port for port in PORTS if not port_in_use(port)][:count]
    if len(found) < count:
        pytest.fail(f"fewer than {count} free ports in {PORTS}")
    return found


@contextlib.contextmanager
def secure_broker(data_dir: Path) -> Iterator[SecureBroker]:
    """A SASL_SSL broker with the authorizer on; skipped without Java or openssl unless CI."""
    missing = [tool for tool in ("java", "openssl") if shutil.which(tool) is None]
    if missing:
        reason = f"{', '.join(missing)} not on PATH: no secure broker"
        if _in_ci():
            pytest.fail(f"{reason} (CI=true: broker tests must run)", pytrace=False)
        pytest.skip(reason)
    port, controller_port = free_ports(2)
    broker = SecureBroker(data_dir, port, controller_port, users=ROLES, authorizer=True)
    try:
        broker.up()
    except DevstackError as exc:
        pytest.fail(f"the secure broker did not start: {exc}", pytrace=False)
    try:
        yield broker
    finally:
        broker.down()


@dataclass
class Ran:
    """A finished process: its exit code and what it printed (stdout and stderr)."""

    code: int
    out: str
    err: str


@dataclass
class SecureStack:
    """One namespace on the secure broker, its ACLs created, and processes run by role."""

    broker: SecureBroker
    tmp: Path
    namespace: str = ""
    partitions: int = 2
    dispatch_key: str = ""
    node_key: str = ""

    def __post_init__(self) -> None:
        self.namespace = self.namespace or unique_name("sec")
        self.dispatch_key = self.dispatch_key or DispatchKey.generate()
        self.node_key = self.node_key or generate_node_key()
        self.procs: list[asyncio.subprocess.Process] = []

    def add_acls(self) -> int:
        return self.broker.add_acls(role_acls(self.namespace))

    def env(self, user: str, **overrides: str) -> dict[str, str]:
        """A process environment for ``user`` with nothing of the caller's Kafka settings."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("EVSCHED_")}
        env.update(self.broker.client_env(user))
        env.update(
            EVSCHED_NAMESPACE=self.namespace,
            EVSCHED_EVENT_PARTITIONS=str(self.partitions),
            PYTHONPATH=os.pathsep.join([str(REPO / "src"), str(REPO)]),
        )
        if user in {"node", "worker"}:
            env["EVSCHED_DISPATCH_KEY"] = self.dispatch_key
        if user in {"node", "api"}:  # nodes prove their facts; the API checks proofs
            env["EVSCHED_NODE_KEY"] = self.node_key
        env.update(overrides)
        return env

    async def spawn(self, name: str, user: str, *args: str, **env: str) -> Path:
        """Start ``evsched <args>`` as ``user`` in the background; its log file."""
        log_path = self.tmp / f"{name}.log"
        with log_path.open("ab") as out:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "evsched", *args,
                cwd=REPO, env=self.env(user, **env), stdout=out, stderr=out,
            )  # fmt: skip
        self.procs.append(proc)
        return log_path

    async def run(
        self, user: str, *args: str, timeout_s: float = PROCESS_TIMEOUT_S, **env: str
    ) -> Ran:
        """Run ``evsched <args>`` as ``user`` to its end (killed at the deadline)."""
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "evsched", *args,
            cwd=REPO, env=self.env(user, **env),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        try:
            out, err = await asyncio.wait_for(proc.communicate(), timeout_s)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise AssertionError(
                f"evsched {' '.join(args)} as {user} ran past {timeout_s} s"
            ) from None
        assert proc.returncode is not None
        return Ran(proc.returncode, out.decode(errors="replace"), err.decode(errors="replace"))

    async def close(self) -> None:
        """Stop what we spawned, by pid: SIGTERM, then SIGKILL after a deadline."""
        for proc in self.procs:
            if proc.returncode is None:
                proc.terminate()
        for proc in self.procs:
            try:
                await asyncio.wait_for(proc.wait(), 30)
            except TimeoutError:
                proc.kill()
                await proc.wait()
