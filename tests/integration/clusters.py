"""The three-broker cluster the ``cluster`` tests share per module, and what they do to its nodes.

A module's fixture calls ``module_cluster``: three KRaft nodes on free ports (the shared broker is
never touched), stopped at the module's end. ``heal`` brings every node back after a test that
killed, froze or stopped one, and waits until every replica is in sync again, so the next test
starts on a whole cluster.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError
from tests.integration.engine import wait_for

from evsched.devstack.cluster import LocalCluster
from evsched.devstack.errors import DevstackError
from evsched.devstack.process import free_port, is_alive


def _free_ports(count: int) -> list[int]:
    ports: set[int] = set()
    while len(ports) < count:
        ports.add(free_port())
    return sorted(ports)


@contextmanager
def module_cluster(data_dir: Path) -> Iterator[LocalCluster]:
    """Three KRaft nodes on free ports; skipped without the jars (failed under CI=true)."""
    flat = _free_ports(6)
    local = LocalCluster(
        data_dir,
        brokers=3,
        ready_timeout_s=300.0,
        ports=list(zip(flat[0::2], flat[1::2], strict=True)),
    )
    try:
        local.up()
    except DevstackError as exc:
        local.down()
        if os.environ.get("CI") == "true":
            pytest.fail(f"local cluster: {exc}")
        pytest.skip(f"local cluster: {exc}")
    try:
        yield local
    finally:
        thaw(local)  # a frozen JVM ignores SIGTERM until continued
        local.down()


def thaw(cluster: LocalCluster) -> None:
    for node in cluster.nodes:
        if (pid := node.status().pid) is not None:
            os.kill(pid, signal.SIGCONT)


async def kill(cluster: LocalCluster, node_id: int) -> int:
    """SIGKILL one node; returns once its process is gone (its pid)."""
    pid = cluster.node(node_id).status().pid
    assert pid is not None, f"broker {node_id} is not running"
    os.kill(pid, signal.SIGKILL)

    async def gone() -> bool:
        return not is_alive(pid)

    await wait_for(gone, what=f"broker {node_id} (pid {pid}) to exit", timeout_s=30)
    return pid


async def all_in_sync(bootstrap: str) -> bool:
    """Whether every partition of every topic has all its replicas in sync (False on errors)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        await admin.start()
        topics = await admin.list_topics()
        described = await admin.describe_topics(list(topics))
    except KafkaError:
        return False
    finally:
        await admin.close()
    partitions = [p for t in described for p in t.get("partitions") or []]
    return all(p["leader"] >= 0 and set(p["isr"]) == set(p["replicas"]) for p in partitions)


async def heal(cluster: LocalCluster, timeout_s: float = 180.0) -> None:
    """Thaw and start every node that is not running; wait until every replica is in sync."""
    thaw(cluster)
    status = await asyncio.to_thread(cluster.up)
    assert status.running, status.as_dict()

    async def synced() -> bool:
        if await all_in_sync(cluster.bootstrap):
            return True
        await asyncio.sleep(0.5)
        return False

    await wait_for(synced, what="every replica back in sync", timeout_s=timeout_s)
