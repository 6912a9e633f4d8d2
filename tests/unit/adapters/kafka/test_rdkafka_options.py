"""Settings.kafka_options as librdkafka configuration: each security setting in librdkafka's
words, and what it cannot take refused by name."""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from evsched.adapters.kafka.rdkafka_options import UnsupportedKafkaOption, rdkafka_config
from evsched.adapters.kafka.rdkafka_producer import producer_config
from evsched.devstack.certs import make_ca
from evsched.settings import Settings, SettingsError, kafka_options

SCRAM = {
    "EVSCHED_KAFKA_SECURITY_PROTOCOL": "sasl_ssl",
    "EVSCHED_KAFKA_SASL_MECHANISM": "scram-sha-512",
    "EVSCHED_KAFKA_SASL_USERNAME": "node",
    "EVSCHED_KAFKA_SASL_PASSWORD": "pw",
}


def test_sasl_over_tls_maps_to_librdkafka_names(tmp_path: Path) -> None:
    ca = make_ca(tmp_path)
    config = rdkafka_config(kafka_options({**SCRAM, "EVSCHED_KAFKA_SSL_CAFILE": str(ca.cert)}))
    assert config["security.protocol"] == "sasl_ssl"
    assert config["sasl.mechanisms"] == "SCRAM-SHA-512"
    assert (config["sasl.username"], config["sasl.password"]) == ("node", "pw")
    assert config["ssl.endpoint.identification.algorithm"] == "https"
    assert config["enable.ssl.certificate.verification"] is True
    # The CA file's certificate, handed over as PEM (librdkafka cannot take an SSLContext).
    assert config["ssl.ca.pem"].strip() == ca.cert.read_text().strip()
    assert "ssl.ca.location" not in config


def test_a_context_without_ca_file_uses_the_system_store_and_may_skip_the_name() -> None:
    bare = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    bare.check_hostname = False
    config = rdkafka_config({"security_protocol": "SSL", "ssl_context": bare})
    assert config["security.protocol"] == "ssl"
    assert config["ssl.ca.location"] == "probe"
    assert config["ssl.endpoint.identification.algorithm"] == "none"
    assert config["enable.ssl.certificate.verification"] is True


def test_an_unverified_context_stays_unverified() -> None:
    bare = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    bare.check_hostname = False
    bare.verify_mode = ssl.CERT_NONE
    assert rdkafka_config({"ssl_context": bare})["enable.ssl.certificate.verification"] is False


def test_settings_from_every_supported_variable_make_a_producer(tmp_path: Path) -> None:
    # librdkafka itself checks the names and values when the producer is made.
    ca = make_ca(tmp_path)
    for mechanism in ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"):
        env = {**SCRAM, "EVSCHED_KAFKA_SASL_MECHANISM": mechanism}
        settings = Settings.from_env({**env, "EVSCHED_KAFKA_SSL_CAFILE": str(ca.cert)})
        Producer(producer_config(settings, client_id="evsched-unit")).close()


@pytest.mark.parametrize(
    ("options", "named"),
    [
        # The manylinux wheels have no libsasl2: GSSAPI would fail inside librdkafka.
        ({"sasl_mechanism": "GSSAPI"}, "GSSAPI"),
        ({"sasl_mechanism": "OAUTHBEARER"}, "OAUTHBEARER"),
        ({"sasl_oauth_token_provider": object()}, "sasl_oauth_token_provider"),
        ({"sasl_kerberos_domain_name": "example.org"}, "sasl_kerberos_domain_name"),
        ({"ssl_context": "/etc/ssl/ca.pem"}, "ssl_context"),
        ({"security_protocol": "TLS"}, "security_protocol"),
        ({"api_version": "2.8.0"}, "api_version"),
    ],
)
def test_an_option_without_a_faithful_translation_is_refused_by_name(
    options: dict[str, Any], named: str
) -> None:
    with pytest.raises(UnsupportedKafkaOption, match=named) as refused:
        rdkafka_config({**options, "sasl_plain_password": "s3cret"})
    assert "s3cret" not in str(refused.value)
    assert isinstance(refused.value, SettingsError)
