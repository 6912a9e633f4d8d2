"""The TLS/SASL variables (``EVSCHED_KAFKA_*``): what the Kafka client gets, and every value it
could not use refused up front with the variable's name."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest

from evsched.settings import Settings, SettingsError, kafka_options

SCRAM = {
    "EVSCHED_KAFKA_SECURITY_PROTOCOL": "sasl_ssl",
    "EVSCHED_KAFKA_SASL_MECHANISM": "scram-sha-512",
    "EVSCHED_KAFKA_SASL_USERNAME": "node",
    "EVSCHED_KAFKA_SASL_PASSWORD": "pw",
}


def test_protocol_and_mechanism_reach_the_client_in_its_spelling() -> None:
    options = kafka_options(SCRAM)
    assert options["security_protocol"] == "SASL_SSL"
    assert options["sasl_mechanism"] == "SCRAM-SHA-512"
    assert (options["sasl_plain_username"], options["sasl_plain_password"]) == ("node", "pw")
    assert isinstance(options["ssl_context"], ssl.SSLContext)


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        ({"EVSCHED_KAFKA_SECURITY_PROTOCOL": "TLS"}, "EVSCHED_KAFKA_SECURITY_PROTOCOL"),
        ({"EVSCHED_KAFKA_SASL_MECHANISM": "SCRAM-SHA-1"}, "EVSCHED_KAFKA_SASL_MECHANISM"),
        ({"EVSCHED_KAFKA_SASL_MECHANISM": "OAUTHBEARER"}, "EVSCHED_KAFKA_SASL_MECHANISM"),
        ({"EVSCHED_KAFKA_SASL_USERNAME": ""}, "EVSCHED_KAFKA_SASL_USERNAME"),
        ({"EVSCHED_KAFKA_SASL_PASSWORD": ""}, "EVSCHED_KAFKA_SASL_PASSWORD"),
        ({"EVSCHED_KAFKA_SSL_CHECK_HOSTNAME": "maybe"}, "EVSCHED_KAFKA_SSL_CHECK_HOSTNAME"),
        ({"EVSCHED_KAFKA_SSL_CAFILE": "/nonexistent/ca.pem"}, "EVSCHED_KAFKA_SSL_CAFILE"),
        (
            {"EVSCHED_KAFKA_SASL_PASSWORD_FILE": "/nonexistent/pw"},
            "EVSCHED_KAFKA_SASL_PASSWORD_FILE",
        ),
    ],
)
def test_a_value_the_client_cannot_use_is_refused_naming_the_variable(
    overrides: dict[str, str], named: str
) -> None:
    with pytest.raises(SettingsError, match=named) as refused:
        Settings.from_env({**SCRAM, **overrides})
    assert "\n" not in str(refused.value)
    assert "pw" not in str(refused.value).replace("PASSWORD", "")


def test_the_password_may_come_from_a_file_but_not_from_both(tmp_path: Path) -> None:
    secret = tmp_path / "kafka-password"
    secret.write_text("from-a-file\n", encoding="utf-8")
    env = {**SCRAM, "EVSCHED_KAFKA_SASL_PASSWORD": ""}
    env["EVSCHED_KAFKA_SASL_PASSWORD_FILE"] = str(secret)
    settings = Settings.from_env(env)
    assert settings.kafka_options["sasl_plain_password"] == "from-a-file"
    assert "from-a-file" not in repr(settings)
    with pytest.raises(SettingsError, match="use one"):
        Settings.from_env({**env, "EVSCHED_KAFKA_SASL_PASSWORD": "pw"})


def test_hostname_checks_can_be_turned_off_but_the_chain_is_still_verified() -> None:
    context = kafka_options({**SCRAM, "EVSCHED_KAFKA_SSL_CHECK_HOSTNAME": "false"})["ssl_context"]
    assert context.check_hostname is False
    assert context.verify_mode is ssl.CERT_REQUIRED
    assert kafka_options(SCRAM)["ssl_context"].check_hostname is True


def test_gssapi_needs_no_password_and_plaintext_no_mechanism() -> None:
    gssapi = {"EVSCHED_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT"}
    gssapi["EVSCHED_KAFKA_SASL_MECHANISM"] = "GSSAPI"
    assert kafka_options(gssapi)["sasl_mechanism"] == "GSSAPI"
    assert kafka_options({}) == {}


def test_a_mechanism_without_a_sasl_protocol_is_not_passed_on() -> None:
    assert kafka_options({"EVSCHED_KAFKA_SASL_MECHANISM": "scram-sha-512"}) == {}
    assert kafka_options({"EVSCHED_KAFKA_SECURITY_PROTOCOL": "plaintext"}) == {
        "security_protocol": "PLAINTEXT"
    }
