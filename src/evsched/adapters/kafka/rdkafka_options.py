"""Settings.kafka_options (aiokafka's names) as librdkafka configuration, or a clear refusal.

``Settings.kafka_options`` speaks aiokafka: ``security_protocol``, ``sasl_plain_username``, an
``ssl.SSLContext``. librdkafka takes dotted names and files or PEM text, never a context object, so
each option is translated here; one without a faithful translation raises
``UnsupportedKafkaOption`` naming it, rather than connecting with weaker security than asked for.
"""

from __future__ import annotations

import ssl
from collections.abc import Callable, Mapping
from typing import Any

from evsched.settings import SettingsError

# The manylinux wheels of confluent-kafka are built without libsasl2 ("Current build options:
# PLAIN SASL_SCRAM OAUTHBEARER"); OAUTHBEARER needs a token callback that evsched does not pass on.
MECHANISMS = frozenset({"PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"})
PROTOCOLS = frozenset({"PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"})

# aiokafka's option -> librdkafka's property, where the value carries over as it is.
_SAME_VALUE = {
    "sasl_plain_username": "sasl.username",
    "sasl_plain_password": "sasl.password",
    "sasl_kerberos_service_name": "sasl.kerberos.service.name",
    "request_timeout_ms": "request.timeout.ms",
    "metadata_max_age_ms": "topic.metadata.refresh.interval.ms",
    "connections_max_idle_ms": "connections.max.idle.ms",
    "retry_backoff_ms": "retry.backoff.ms",
    "max_request_size": "message.max.bytes",
    "linger_ms": "linger.ms",
}


class UnsupportedKafkaOption(SettingsError):
    """A Kafka client option librdkafka cannot be given faithfully; the message names it."""


def rdkafka_config(options: Mapping[str, Any]) -> dict[str, Any]:
    """librdkafka's configuration for aiokafka-named ``options``; UnsupportedKafkaOption when
    one of them has no faithful translation (its value never appears in the message)."""
    config: dict[str, Any] = {}
    for name, value in options.items():
        if name in _SAME_VALUE:
            config[_SAME_VALUE[name]] = value
        elif (translate := _TRANSLATED.get(name)) is not None:
            config.update(translate(value))
        else:
            raise UnsupportedKafkaOption(
                f"Kafka option {name!r} has no librdkafka equivalent in evsched: use "
                "EVSCHED_KAFKA_CLIENT=aiokafka, or leave the option out"
            )
    return config


def _protocol(value: Any) -> dict[str, Any]:
    protocol = str(value).upper()
    if protocol not in PROTOCOLS:
        raise UnsupportedKafkaOption(f"security_protocol={protocol!r}: expected one of {PROTOCOLS}")
    return {"security.protocol": protocol.lower()}


def _mechanism(value: Any) -> dict[str, Any]:
    mechanism = str(value).upper()
    if mechanism not in MECHANISMS:
        raise UnsupportedKafkaOption(
            f"sasl_mechanism={mechanism!r}: confluent-kafka's wheels support only "
            f"{', '.join(sorted(MECHANISMS))}; use EVSCHED_KAFKA_CLIENT=aiokafka"
        )
    return {"sasl.mechanisms": mechanism}


def _tls(value: Any) -> dict[str, Any]:
    """What librdkafka can take of an SSLContext: its CA certificates as PEM, whether it checks
    the broker's certificate and name.

    A client certificate loaded into the context (mutual TLS) cannot be read back out of it, and
    would silently be missing: evsched's own settings never load one, and a context that carries
    one must be given to aiokafka instead.
    """
    if not isinstance(value, ssl.SSLContext):
        raise UnsupportedKafkaOption("ssl_context: expected an ssl.SSLContext")
    config: dict[str, Any] = {
        "ssl.endpoint.identification.algorithm": "https" if value.check_hostname else "none",
        "enable.ssl.certificate.verification": value.verify_mode != ssl.CERT_NONE,
    }
    cas = value.get_ca_certs(binary_form=True)
    if cas:
        config["ssl.ca.pem"] = "".join(ssl.DER_cert_to_PEM_cert(der) for der in cas)
    else:  # the system's trust store, as the context itself would use (no CA file was given)
        config["ssl.ca.location"] = "probe"
    return config


_TRANSLATED: dict[str, Callable[[Any], dict[str, Any]]] = {
    "security_protocol": _protocol,
    "sasl_mechanism": _mechanism,
    "ssl_context": _tls,
}
