"""A broker's refusal of this client (TLS, SASL) told from an outage, and named in one line."""

from __future__ import annotations

import ssl
from typing import Any

import pytest
from aiokafka.errors import (
    KafkaConnectionError,
    NodeNotReadyError,
    SaslAuthenticationFailed,
    UnsupportedSaslMechanismError,
)

from evsched.adapters.kafka import access as kafka_access
from evsched.adapters.kafka.access import (
    access_refusal,
    check_access,
    failure_text,
    raise_if_refused,
)
from evsched.devstack.process import free_port
from evsched.errors import BrokerAccessRefused

OPTIONS = {
    "security_protocol": "SASL_SSL",
    "sasl_mechanism": "SCRAM-SHA-512",
    "sasl_plain_username": "node",
    "sasl_plain_password": "secret-pw",
    "request_timeout_ms": 1000,  # not a connection option: left out of the probe
}


def _verify_error(code: int, message: str) -> ssl.SSLCertVerificationError:
    error = ssl.SSLCertVerificationError(1, f"[SSL: CERTIFICATE_VERIFY_FAILED] {message}")
    error.verify_code = code
    error.verify_message = message
    return error


def _refusing(monkeypatch: pytest.MonkeyPatch, error: BaseException) -> list[dict[str, Any]]:
    seen: list[dict[str, Any]] = []

    async def create_conn(host: str, port: int, **options: Any) -> Any:
        seen.append(options)
        raise error

    monkeypatch.setattr(kafka_access, "create_conn", create_conn)
    return seen


@pytest.mark.parametrize(
    ("error", "says"),
    [
        (
            SaslAuthenticationFailed("Authentication failed due to invalid credentials"),
            "SASL authentication as 'node' with SCRAM-SHA-512 failed: Authentication failed due",
        ),
        (UnsupportedSaslMechanismError("x"), "SCRAM-SHA-512 is not enabled on the broker"),
        (
            _verify_error(20, "unable to get local issuer certificate"),
            "TLS certificate is not trusted (unable to get local issuer certificate); "
            "EVSCHED_KAFKA_SSL_CAFILE",
        ),
        (_verify_error(62, "Hostname mismatch"), "EVSCHED_KAFKA_SSL_CHECK_HOSTNAME=false"),
        (_verify_error(10, "certificate has expired"), "certificate has expired"),
        (ssl.SSLError(1, "[SSL: WRONG_VERSION_NUMBER] wrong version number"), "TLS listener?"),
    ],
)
async def test_a_refusal_is_named_in_one_line(
    monkeypatch: pytest.MonkeyPatch, error: BaseException, says: str
) -> None:
    seen = _refusing(monkeypatch, error)
    refusal = await access_refusal("b1:9093,b2:9093", **OPTIONS)
    assert refusal is not None
    text = str(refusal)
    assert text.startswith("Kafka at b1:9093 refused the connection: ")
    assert says in text and "\n" not in text
    assert "secret-pw" not in text
    assert seen[0]["request_timeout_ms"] == 10_000  # its own, not the client's


@pytest.mark.parametrize(
    "error", [ConnectionRefusedError(111, "refused"), TimeoutError(), KafkaConnectionError("x")]
)
async def test_an_outage_is_no_refusal(
    monkeypatch: pytest.MonkeyPatch, error: BaseException
) -> None:
    seen = _refusing(monkeypatch, error)
    assert await access_refusal("b1:9093,b2:9093", **OPTIONS) is None
    assert len(seen) == 2  # every bootstrap address was tried
    await check_access("b1:9093", **OPTIONS)  # passes: the caller's retries handle outages


async def test_nothing_listening_is_no_refusal() -> None:
    assert await access_refusal(f"127.0.0.1:{free_port()}", timeout_s=2.0) is None


async def test_an_accepted_connection_is_closed_and_no_refusal(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    closed: list[bool] = []

    class Conn:
        def close(self) -> None:
            closed.append(True)

    async def create_conn(host: str, port: int, **options: Any) -> Conn:
        return Conn()

    monkeypatch.setattr(kafka_access, "create_conn", create_conn)
    assert await access_refusal("b1:9093", **OPTIONS) is None
    assert closed == [True]


async def test_only_a_failed_bootstrap_is_diagnosed(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = _refusing(monkeypatch, SaslAuthenticationFailed("invalid credentials"))
    await raise_if_refused("b1:9093", NodeNotReadyError("busy"), **OPTIONS)
    assert seen == []
    assert await failure_text("b1:9093", NodeNotReadyError("busy")) == repr(
        NodeNotReadyError("busy")
    )
    failed = KafkaConnectionError("Unable to bootstrap from [('b1', 9093)]")
    with pytest.raises(BrokerAccessRefused, match="invalid credentials") as raised:
        await raise_if_refused("b1:9093", failed, **OPTIONS)
    assert raised.value.__cause__ is failed
    assert "invalid credentials" in await failure_text("b1:9093", failed, **OPTIONS)
    with pytest.raises(BrokerAccessRefused):
        await check_access("b1:9093", **OPTIONS)


async def test_an_outage_keeps_its_own_words(monkeypatch: pytest.MonkeyPatch) -> None:
    _refusing(monkeypatch, ConnectionRefusedError(111, "refused"))
    failed = KafkaConnectionError("Unable to bootstrap")
    await raise_if_refused("b1:9093", failed)
    assert await failure_text("b1:9093", failed) == repr(failed)


def test_kafka_topics_prints_a_refusal_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from evsched.cli import kafka as cli

    async def refused(*args: Any, **options: Any) -> list[str]:
        raise BrokerAccessRefused("Kafka at b1:9093 refused the connection: SASL ... failed")

    monkeypatch.setattr(cli, "ensure_topics", refused)
    result = CliRunner().invoke(cli.kafka_app, ["topics"], env={})
    assert result.exit_code != 0
    assert "Traceback" not in result.output
    lines = [line for line in result.output.splitlines() if "refused the connection" in line]
    assert len(lines) == 1, result.output
