"""Authentication settings of the API (issue 9, D.11): guarded reads, no silent "no auth",
secrets kept out of reprs, and Kafka TLS settings that use the system trust store.
"""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from evsched.api.auth import AuthConfigError, Tokens, load_tokens
from evsched.settings import Settings
from tests.unit.api.test_api_twin import TOKEN, Harness

READ_TOKEN = "read-only-token-for-tests"


@pytest.fixture
async def reads_guarded(tmp_path: Path) -> AsyncIterator[Harness]:
    async with Harness(tmp_path, tokens=Tokens(write=TOKEN, read=READ_TOKEN)) as harness:
        yield harness


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def test_guarded_reads_need_the_read_or_the_write_token(reads_guarded: Harness) -> None:
    api = reads_guarded
    made = await api.http.post("/v1/jobs", json={"task": "t"}, headers=bearer(TOKEN))
    assert made.status_code == 201
    paths = [f"/v1/jobs/{made.json()['id']}", "/v1/jobs", "/v1/stats", "/v1/schedules"]
    for path in paths:
        assert (await api.http.get(path)).status_code == 401, path
        assert (await api.http.get(path, headers=bearer("nope"))).status_code == 403, path
        assert (await api.http.get(path, headers=bearer(READ_TOKEN))).status_code == 200, path
        assert (await api.http.get(path, headers=bearer(TOKEN))).status_code == 200, path
    # Probes and metrics stay open: orchestrators and scrapers carry no token.
    for path in ("/healthz", "/readyz", "/metrics"):
        assert (await api.http.get(path)).status_code == 200, path


async def test_the_read_token_cannot_write(reads_guarded: Harness) -> None:
    denied = await reads_guarded.http.post(
        "/v1/jobs", json={"task": "t"}, headers=bearer(READ_TOKEN)
    )
    assert denied.status_code == 403
    assert reads_guarded.log.records == []


async def test_auth_reads_with_one_token_for_both(tmp_path: Path) -> None:
    async with Harness(tmp_path, tokens=Tokens(write=TOKEN, auth_reads=True)) as api:
        assert (await api.http.get("/v1/jobs")).status_code == 401
        assert (await api.http.get("/v1/jobs", headers=bearer(TOKEN))).status_code == 200


def test_an_empty_token_is_never_taken_for_no_auth() -> None:
    with pytest.raises(AuthConfigError):
        Tokens(write="")
    with pytest.raises(AuthConfigError, match="no write token"):
        load_tokens({"EVSCHED_API_TOKEN": ""})
    with pytest.raises(AuthConfigError, match="needs a write token"):
        Tokens(read="r")
    assert load_tokens({}, no_auth=True) == Tokens()


def test_a_token_in_env_and_a_file_is_ambiguous(tmp_path: Path) -> None:
    (tmp_path / "t").write_text("a")
    with pytest.raises(AuthConfigError, match="use one"):
        load_tokens({"EVSCHED_API_TOKEN": "b"}, token_file=tmp_path / "t")
    with pytest.raises(AuthConfigError, match="cannot read"):
        load_tokens({}, token_file=tmp_path / "missing")


def test_secrets_never_show_in_a_repr() -> None:
    tokens = Tokens(write="w-secret-for-a-repr", read="r-secret-for-a-repr")
    assert "secret" not in repr(tokens)
    settings = Settings.from_env(
        {
            "EVSCHED_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
            "EVSCHED_KAFKA_SASL_MECHANISM": "PLAIN",
            "EVSCHED_KAFKA_SASL_USERNAME": "svc",
            "EVSCHED_KAFKA_SASL_PASSWORD": "hunter2-secret",
        }
    )
    assert settings.kafka_options["sasl_plain_password"] == "hunter2-secret"
    assert "hunter2" not in repr(settings)
    assert "hunter2" not in str(settings)
    assert "svc" in repr(settings)


@pytest.mark.parametrize("protocol", ["SSL", "SASL_SSL", "ssl"])
def test_tls_without_a_ca_file_uses_the_system_trust_store(protocol: str) -> None:
    sasl = {"EVSCHED_KAFKA_SASL_USERNAME": "svc", "EVSCHED_KAFKA_SASL_PASSWORD": "pw"}
    env = {"EVSCHED_KAFKA_SECURITY_PROTOCOL": protocol, **sasl}
    options = Settings.from_env(env).kafka_options
    context = options["ssl_context"]
    assert isinstance(context, ssl.SSLContext)
    assert context.verify_mode is ssl.CERT_REQUIRED
    assert context.check_hostname
    assert (
        context.cert_store_stats()["x509_ca"]
        == ssl.create_default_context().cert_store_stats()["x509_ca"]
    )


def test_plaintext_gets_no_ssl_context() -> None:
    assert "ssl_context" not in Settings.from_env({}).kafka_options


def test_kafka_topics_connects_with_the_security_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from evsched.cli import kafka as cli

    seen: dict[str, Any] = {}

    async def ensure(*args: Any, **options: Any) -> list[str]:
        seen.update(options)
        return ["ns.events"]

    monkeypatch.setattr(cli, "ensure_topics", ensure)
    result = CliRunner().invoke(
        cli.kafka_app,
        ["topics"],
        env={
            "EVSCHED_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
            "EVSCHED_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
            "EVSCHED_KAFKA_SASL_USERNAME": "svc",
            "EVSCHED_KAFKA_SASL_PASSWORD": "pw",
        },
    )
    assert result.exit_code == 0, result.output
    assert seen["security_protocol"] == "SASL_SSL"
    assert seen["sasl_mechanism"] == "SCRAM-SHA-512"
    assert (seen["sasl_plain_username"], seen["sasl_plain_password"]) == ("svc", "pw")
    assert isinstance(seen["ssl_context"], ssl.SSLContext)
