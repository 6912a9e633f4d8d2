"""Settings never show a secret of the Kafka client's options (issue 32): not in their repr or str,
nor in the repr of the options themselves."""

from __future__ import annotations

import dataclasses
import ssl

from evsched.settings import Settings

SASL = {
    "EVSCHED_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
    "EVSCHED_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
    "EVSCHED_KAFKA_SASL_USERNAME": "svc-user",
    "EVSCHED_KAFKA_SASL_PASSWORD": "hunter2-sasl",
}
# What a library user may pass on to the client besides the environment's options.
IN_CODE = {
    "sasl_plain_username": "svc-user",
    "sasl_plain_password": "hunter2-sasl",
    "ssl_password": "hunter2-tls-key",
    "ssl_keyfile_password": "hunter2-keyfile",
    "sasl_oauth_token_provider": "hunter2-token",
    "client_secret": "hunter2-secret",
    "request_timeout_ms": 40_000,
}


def shown(settings: Settings) -> list[str]:
    options = settings.kafka_options
    return [repr(settings), str(settings), repr(options), str(options), f"{options}"]


def test_the_sasl_password_from_the_environment_never_shows() -> None:
    settings = Settings.from_env(SASL)
    assert settings.kafka_options["sasl_plain_password"] == "hunter2-sasl"  # still usable
    for text in shown(settings):
        assert "hunter2" not in text, text
        assert "svc-user" in text and "SCRAM-SHA-512" in text  # what is not secret still shows


def test_secrets_passed_in_code_never_show_and_still_reach_the_client() -> None:
    settings = Settings(kafka_options=IN_CODE)
    for text in shown(settings):
        assert "hunter2" not in text, text
        assert "40000" in text
    assert dict(settings.kafka_options) == IN_CODE  # what the Kafka client is given
    assert {**settings.kafka_options}["ssl_password"] == "hunter2-tls-key"
    copied = dataclasses.replace(settings, namespace="other")
    assert "hunter2" not in repr(copied.kafka_options) and copied.kafka_options == IN_CODE


def test_an_ssl_context_stays_what_it_is() -> None:
    context = ssl.create_default_context()
    settings = Settings(kafka_options={"ssl_context": context})
    assert settings.kafka_options["ssl_context"] is context
    assert settings == Settings(kafka_options={"ssl_context": context})
