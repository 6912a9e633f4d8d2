"""The role ACL set as docs/security.md prints it, the stock tool's commands, and the test CA."""

from __future__ import annotations

import shutil
import ssl
import subprocess
from pathlib import Path

import pytest

from evsched.adapters.kafka.acls import AclRule
from evsched.adapters.kafka.atomic_batch import AtomicWriter, batch_transactional_id
from evsched.devstack.acls import ROLES, acl_table, kafka_acls_command, role_acls
from evsched.devstack.certs import make_ca, make_server_cert
from evsched.devstack.secure import SecureBroker
from evsched.devstack.toolchain import KAFKA4_VERSION, KAFKA_VERSION, KafkaDist
from evsched.errors import PublishError
from evsched.ports import Outbound
from evsched.settings import Settings

REPO = Path(__file__).resolve().parents[3]


def test_docs_show_exactly_the_acls_the_tests_apply() -> None:
    text = (REPO / "docs" / "security.md").read_text(encoding="utf-8")
    assert acl_table("evsched") in text


def _may(role: str, operation: str, name: str, kind: str = "Topic") -> bool:
    def matches(rule: AclRule) -> bool:
        if rule.prefixed:
            return name.startswith(rule.name)
        return name == rule.name

    return any(
        rule.principal == f"User:{role}"
        and rule.resource_type == kind
        and operation in rule.operations
        and matches(rule)
        for rule in role_acls("ns")
    )


@pytest.mark.parametrize("role", ROLES)
def test_only_nodes_write_dispatch_and_effects_and_only_operators_create(role: str) -> None:
    for topic in ("ns.dispatch.default", "ns.effects"):
        assert _may(role, "Write", topic) is (role == "node")
    assert _may(role, "Create", "ns.dispatch.default") is (role == "operator")
    # Another namespace is out of reach of every role.
    for operation in ("Read", "Write", "Describe", "Create"):
        assert not _may(role, operation, "other.events")


async def test_only_producers_and_the_api_may_write_atomic_batches(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The atomic writer's transactional id is one the ACLs of producers and the API cover."""
    asked: list[str | None] = []

    async def start_producer(settings: Settings, **options: str | None) -> object:
        asked.append(options["transactional_id"])
        raise PublishError("no broker here")

    monkeypatch.setattr("evsched.adapters.kafka.atomic_batch.start_producer", start_producer)
    writer = AtomicWriter(Settings(namespace="ns"), client_id="evsched-api")
    with pytest.raises(PublishError):
        await writer.write("ns.events", [Outbound("job", b"v")])
    (transactional_id,) = asked
    assert transactional_id is not None
    assert transactional_id != batch_transactional_id("ns", "evsched-api")  # unique per writer
    for role in ROLES:
        for operation in ("Write", "Describe"):
            allowed = _may(role, operation, transactional_id, "TransactionalId")
            assert allowed is (role in {"producer", "api"}), (role, operation)
        # A batch writer can never use a node's id (and fence the node).
        node_id = "ns.node.p0"
        assert _may(role, "Write", node_id, "TransactionalId") is (role == "node")


def test_the_stock_tool_command_of_a_rule() -> None:
    rule = AclRule(
        principal="User:worker",
        operations=("Read",),
        resource_type="Group",
        name="ns.workers.",
        prefixed=True,
    )
    assert kafka_acls_command(rule, bootstrap="b:9093")[-8:] == [
        "--allow-principal", "User:worker", "--operation", "Read",
        "--group", "ns.workers.", "--resource-pattern-type", "prefixed",
    ]  # fmt: skip
    with pytest.raises(ValueError, match="unknown"):
        AclRule(principal="User:x", operations=("Fly",), resource_type="Topic", name="t")


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl not on PATH")
def test_the_broker_certificate_verifies_against_its_ca_only(tmp_path: Path) -> None:
    ca = make_ca(tmp_path / "ca", name="ca")
    server = make_server_cert(ca, tmp_path / "server", hosts=("127.0.0.1", "localhost"))
    other = make_ca(tmp_path / "other", name="other")
    verify = ["openssl", "verify", "-x509_strict", "-purpose", "sslserver", "-CAfile"]
    good = subprocess.run(
        [*verify, str(ca.cert), str(server.cert)], capture_output=True, check=False
    )
    assert good.returncode == 0, good.stderr
    bad = subprocess.run(
        [*verify, str(other.cert), str(server.cert)], capture_output=True, check=False
    )
    assert bad.returncode != 0
    text = server.keystore.read_text(encoding="utf-8")
    assert text.index("BEGIN PRIVATE KEY") < text.index("BEGIN CERTIFICATE")
    assert server.keystore.stat().st_mode & 0o077 == 0
    ssl.create_default_context(cafile=ca.cert).load_cert_chain(server.keystore)


def test_a_secure_broker_hands_out_the_documented_variables(tmp_path: Path) -> None:
    broker = SecureBroker(tmp_path / "b", 19740, 19741, users=["node"])
    env = broker.client_env("node")
    assert env.pop("EVSCHED_KAFKA_SSL_CAFILE") == str(broker.ca.cert)  # made by `up`
    settings = Settings.from_env({**env, "EVSCHED_NAMESPACE": "ns"})
    assert settings.bootstrap == "127.0.0.1:19740"
    assert settings.kafka_options["sasl_mechanism"] == "SCRAM-SHA-512"
    assert settings.kafka_options["sasl_plain_password"] == broker.passwords["node"]
    # The passwords stay with the data dir: its formatted storage holds them.
    again = SecureBroker(tmp_path / "b", 19740, 19741, users=["node"])
    assert again.passwords == broker.passwords
    assert (tmp_path / "b" / "tls" / "users.json").stat().st_mode & 0o077 == 0


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl not on PATH")
@pytest.mark.parametrize("version", [KAFKA_VERSION, KAFKA4_VERSION])
def test_a_secure_broker_formats_and_logs_as_its_kafka_version_does(
    version: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Kafka 4 reads a log4j2 config (by another flag): the SCRAM format and the broker too."""
    broker = SecureBroker(tmp_path / "b", 19740, 19741, users=["node"])
    broker.dist = KafkaDist(version=version, cache_root=tmp_path / "cache")
    formats: list[list[str]] = []
    run = subprocess.run

    def fake_java(command: list[str], **options: object) -> object:
        if command[0] != "java":
            return run(command, **options)  # type: ignore[call-overload]
        formats.append(command)
        return subprocess.CompletedProcess(command, 0, "", "")

    monkeypatch.setattr(subprocess, "run", fake_java)
    broker._prepare("java")
    (command,) = formats
    log_config = broker.files.log4j_properties
    assert broker.dist.logging_args(log_config)[0] in command
    assert command.count("--add-scram") == 2  # admin and node
    text = log_config.read_text(encoding="utf-8")
    assert ("appender.file.type" in text) is broker.dist.log4j2
    assert ("log4j.rootLogger" in text) is not broker.dist.log4j2
