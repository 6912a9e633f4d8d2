"""Shared fixtures: one Kafka broker per session for tests marked ``broker``, unique names per test.

Where the broker comes from, first match wins:

1. ``EVSCHED_KAFKA_BOOTSTRAP`` names one that already runs;
2. testcontainers' Kafka container, when a Docker daemon answers;
3. a local broker from Maven Central jars (``evsched.devstack``) in a temp dir on free ports.

Without any, broker tests are skipped, except under ``CI=true``, where that is a failure.
"""

from __future__ import annotations

import contextlib
import gc
import os
import secrets
import shutil
import tempfile
import warnings
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import hypothesis
import pytest
from aiokafka.admin import AIOKafkaAdminClient

from evsched.adapters.kafka.topics import ensure_topics
from evsched.devstack.broker import BrokerStatus, LocalBroker
from evsched.devstack.errors import DevstackError
from evsched.devstack.postgres import LocalPostgres
from evsched.devstack.process import free_port

BOOTSTRAP_ENV = "EVSCHED_KAFKA_BOOTSTRAP"
POSTGRES_DSN_ENV = "EVSCHED_TEST_POSTGRES_DSN"
TEST_EVENT_PARTITIONS = 3
TEST_QUEUES = ("default",)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # A test that uses the broker is a broker test, so `-m "not broker"` leaves it out.
    for item in items:
        if "kafka_bootstrap" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.broker)


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish() -> None:
    # Finalizers run now, before the other plugins' session-end hooks. schemathesis' plugin
    # imports its report writers then, and pytest rewrites them (ast.parse). A finalizer run by a
    # collection during that parse (a fenced aiokafka producer leaves a future whose exception
    # nobody retrieved; asyncio logs it, formatting the traceback with ast.parse) re-enters the
    # AST constructor, whose depth count CPython 3.11 keeps per interpreter: `pytest
    # tests/contract` passed, then died with "SystemError: AST constructor recursion depth
    # mismatch" (tests/unit/docs/test_doc_tiers.py).
    gc.collect()


@pytest.fixture(autouse=True)
def _broker_for_marked_tests(request: pytest.FixtureRequest) -> None:
    # A test marked `broker` gets skipped (or failed in CI) when there is none, even if it
    # reaches the broker by other means than the fixture.
    if request.node.get_closest_marker("broker") is not None:
        request.getfixturevalue("kafka_bootstrap")


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() == "true"


# CI draws the same examples on every run (a red CI is a change, not an unlucky draw; run the
# suite locally to explore) and has no per-example deadline, which a loaded machine overran.
hypothesis.settings.register_profile("ci", derandomize=True, deadline=None)
if _in_ci():
    hypothesis.settings.load_profile("ci")


def _docker_answers(timeout_s: float = 1.5) -> bool:
    """True when a Docker daemon answers a ping quickly; any failure means no."""
    socket_path = Path("/var/run/docker.sock")
    if not os.environ.get("DOCKER_HOST") and not socket_path.exists():
        return False
    try:
        import docker

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            client = docker.from_env(timeout=int(max(1, timeout_s)))
            try:
                return bool(client.ping())
            finally:
                client.close()
    except Exception:
        return False


def _container_bootstrap(stack: contextlib.ExitStack, problems: list[str]) -> str | None:
    if not _docker_answers():
        problems.append("no Docker daemon answers")
        return None
    try:
        from testcontainers.community.kafka import KafkaContainer

        container = (
            KafkaContainer()
            .with_kraft()
            .with_env("KAFKA_AUTO_CREATE_TOPICS_ENABLE", "false")
            .with_env("KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR", "1")
            .with_env("KAFKA_TRANSACTION_STATE_LOG_MIN_ISR", "1")
            .with_env("KAFKA_TRANSACTION_STATE_LOG_NUM_PARTITIONS", "4")
        )
        stack.enter_context(container)
        return str(container.get_bootstrap_server())
    except Exception as exc:
        problems.append(f"testcontainers' Kafka failed: {exc!r}")
        return None


def _distinct_free_ports() -> tuple[int, int]:
    port = free_port()
    controller_port = free_port()
    while controller_port == port:
        controller_port = free_port()
    return port, controller_port


def _local_bootstrap(
    stack: contextlib.ExitStack, data_dir: Path, problems: list[str]
) -> str | None:
    port, controller_port = _distinct_free_ports()
    broker = LocalBroker(data_dir, port, controller_port, ready_timeout_s=120.0)
    try:
        status = broker.up()
    except DevstackError as exc:
        problems.append(f"local broker: {exc}")
        return None
    stack.callback(broker.down)
    return status.bootstrap


def start_private_broker(data_dir: Path) -> tuple[LocalBroker, BrokerStatus]:
    """A broker of one test's own, for tests that stop or freeze it (the session's must never be):
    skipped when it cannot start, failed under ``CI=true``. The caller stops it (``down``)."""
    port, controller_port = _distinct_free_ports()
    broker = LocalBroker(data_dir, port, controller_port, ready_timeout_s=180.0)
    try:
        status = broker.up()
    except DevstackError as exc:
        if _in_ci():
            pytest.fail(f"private broker: {exc}")
        pytest.skip(f"private broker: {exc}")
    return broker, status


@pytest.fixture(scope="session")
def kafka_bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The bootstrap address of a broker that lives for the whole session."""
    external = os.environ.get(BOOTSTRAP_ENV, "").strip()
    if external:
        yield external
        return
    with contextlib.ExitStack() as stack:
        problems: list[str] = []
        bootstrap = _container_bootstrap(stack, problems) or _local_bootstrap(
            stack, tmp_path_factory.mktemp("kafka"), problems
        )
        if bootstrap is None:
            reason = "no Kafka broker: " + "; ".join(problems)
            if _in_ci():
                pytest.fail(f"{reason} (CI=true: broker tests must run)", pytrace=False)
            pytest.skip(reason)
        yield bootstrap


@pytest.fixture(scope="session")
def postgres_dsn() -> Iterator[str]:
    """A PostgreSQL server for the whole session: ``EVSCHED_TEST_POSTGRES_DSN``, or a private
    cluster (Debian's initdb and postgres) in a temp dir on a free port, like the local broker.

    Skipped without the server programs, except under ``CI=true``, where that is a failure.
    """
    external = os.environ.get(POSTGRES_DSN_ENV, "").strip()
    if external:
        yield external
        return
    # Not under pytest's temp dir: as root, the server runs as the postgres user, who cannot
    # enter /tmp/pytest-of-root.
    data_dir = Path(tempfile.mkdtemp(prefix="evsched-pg-"))
    server = LocalPostgres(data_dir, free_port(), durable=False)
    try:
        status = server.up()
    except DevstackError as exc:
        shutil.rmtree(data_dir, ignore_errors=True)
        if _in_ci():
            pytest.fail(f"no PostgreSQL: {exc} (CI=true: outbox tests must run)", pytrace=False)
        pytest.skip(f"no PostgreSQL: {exc}")
    try:
        yield status.dsn
    finally:
        server.down()
        shutil.rmtree(data_dir, ignore_errors=True)


def unique_name(prefix: str) -> str:
    """A name no other test (or earlier run against the same broker) uses."""
    return f"{prefix}{secrets.token_hex(4)}"


@pytest.fixture
def group_id() -> str:
    return unique_name("g")


@pytest.fixture
async def fresh_namespace(kafka_bootstrap: str) -> AsyncIterator[str]:
    """A namespace of its own, without topics; its topics are deleted after the test."""
    namespace = unique_name("t")
    yield namespace
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    try:
        await admin.start()
        ours = [t for t in await admin.list_topics() if t.startswith(f"{namespace}.")]
        if ours:
            await admin.delete_topics(ours)
    finally:
        await admin.close()


@pytest.fixture
async def namespace(kafka_bootstrap: str, fresh_namespace: str) -> str:
    """A namespace whose topics exist: events (3 partitions), dispatch.default, effects."""
    await ensure_topics(
        kafka_bootstrap,
        fresh_namespace,
        event_partitions=TEST_EVENT_PARTITIONS,
        queues=TEST_QUEUES,
    )
    return fresh_namespace
