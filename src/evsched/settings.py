"""Process settings read from the environment (``EVSCHED_*``), with defaults for a local stack."""

from __future__ import annotations

import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from evsched.core.limits import namespace_refusal
from evsched.errors import EvschedError

DEFAULT_BROKER_PORT = 19092
DEFAULT_CONTROLLER_PORT = 19093
DEFAULT_BOOTSTRAP = f"127.0.0.1:{DEFAULT_BROKER_PORT}"
DEFAULT_NAMESPACE = "evsched"
DEFAULT_EVENT_PARTITIONS = 6
REPLICATION_FACTOR_ENV = "EVSCHED_REPLICATION_FACTOR"

# Client security settings passed through to the Kafka client, for clusters beyond the local one.
_SECURITY_ENV = {
    "EVSCHED_KAFKA_SECURITY_PROTOCOL": "security_protocol",
    "EVSCHED_KAFKA_SASL_MECHANISM": "sasl_mechanism",
    "EVSCHED_KAFKA_SASL_USERNAME": "sasl_plain_username",
    "EVSCHED_KAFKA_SASL_PASSWORD": "sasl_plain_password",
}
# Options whose values never appear in a repr or a log line.
_SECRET_OPTIONS = frozenset({"sasl_plain_password", "sasl_oauth_token_provider"})


class SettingsError(EvschedError, ValueError):
    """An ``EVSCHED_*`` variable holds what evsched cannot use; the message names it."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Settings:
    bootstrap: str = DEFAULT_BOOTSTRAP
    namespace: str = DEFAULT_NAMESPACE
    event_partitions: int = DEFAULT_EVENT_PARTITIONS
    # None: min(3, brokers) at provisioning (evsched.adapters.topics.choose_replication).
    replication_factor: int | None = None
    # Shown redacted by __repr__: it may hold the SASL password.
    kafka_options: Mapping[str, Any] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        # Every topic name starts with the namespace: one too long or odd would fail at the broker,
        # late and for some queues only.
        if (refusal := namespace_refusal(self.namespace)) is not None:
            raise SettingsError(f"EVSCHED_NAMESPACE={self.namespace[:60]!r}: {refusal}")

    def __repr__(self) -> str:
        options = {
            name: "***" if name in _SECRET_OPTIONS else value
            for name, value in sorted(self.kafka_options.items())
        }
        return (
            f"Settings(bootstrap={self.bootstrap!r}, namespace={self.namespace!r}, "
            f"event_partitions={self.event_partitions!r}, "
            f"replication_factor={self.replication_factor!r}, kafka_options={options!r})"
        )

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if environ is None else environ
        return cls(
            bootstrap=env.get("EVSCHED_KAFKA_BOOTSTRAP", DEFAULT_BOOTSTRAP),
            namespace=env.get("EVSCHED_NAMESPACE", DEFAULT_NAMESPACE),
            event_partitions=_partitions(env.get("EVSCHED_EVENT_PARTITIONS")),
            replication_factor=_replication_factor(env.get(REPLICATION_FACTOR_ENV)),
            kafka_options=kafka_options(env),
        )


def kafka_options(env: Mapping[str, str]) -> dict[str, Any]:
    """The Kafka client's security options from ``EVSCHED_KAFKA_*``; TLS gets an SSL context.

    Without ``EVSCHED_KAFKA_SSL_CAFILE`` a TLS protocol (SSL, SASL_SSL) verifies the broker
    against the system's trust store, as any TLS client would.
    """
    options: dict[str, Any] = {
        option: env[name] for name, option in _SECURITY_ENV.items() if env.get(name)
    }
    cafile = env.get("EVSCHED_KAFKA_SSL_CAFILE") or None
    tls = str(options.get("security_protocol", "")).upper() in {"SSL", "SASL_SSL"}
    if cafile is not None or tls:
        try:
            options["ssl_context"] = ssl.create_default_context(cafile=cafile)
        except (OSError, ssl.SSLError) as exc:
            raise SettingsError(f"EVSCHED_KAFKA_SSL_CAFILE={cafile!r}: {exc}") from None
    return options


def _partitions(text: str | None) -> int:
    if text is None:
        return DEFAULT_EVENT_PARTITIONS
    try:
        count = int(text)
    except ValueError:
        count = 0
    if count < 1:
        raise SettingsError(f"EVSCHED_EVENT_PARTITIONS={text!r}: expected a positive integer")
    return count


def _replication_factor(text: str | None) -> int | None:
    if text is None or not text.strip():
        return None
    try:
        factor = int(text)
    except ValueError:
        factor = 0
    if factor < 1:
        raise SettingsError(f"{REPLICATION_FACTOR_ENV}={text!r}: expected a positive integer")
    return factor
