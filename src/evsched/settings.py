"""Process settings read from the environment (``EVSCHED_*``), with defaults for a local stack."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

DEFAULT_BROKER_PORT = 19092
DEFAULT_CONTROLLER_PORT = 19093
DEFAULT_BOOTSTRAP = f"127.0.0.1:{DEFAULT_BROKER_PORT}"
DEFAULT_NAMESPACE = "evsched"
DEFAULT_EVENT_PARTITIONS = 6

# Client security settings passed through to aiokafka, for clusters beyond the local one.
_SECURITY_ENV = {
    "EVSCHED_KAFKA_SECURITY_PROTOCOL": "security_protocol",
    "EVSCHED_KAFKA_SASL_MECHANISM": "sasl_mechanism",
    "EVSCHED_KAFKA_SASL_USERNAME": "sasl_plain_username",
    "EVSCHED_KAFKA_SASL_PASSWORD": "sasl_plain_password",
}


@dataclass(frozen=True, slots=True, kw_only=True)
class Settings:
    bootstrap: str = DEFAULT_BOOTSTRAP
    namespace: str = DEFAULT_NAMESPACE
    event_partitions: int = DEFAULT_EVENT_PARTITIONS
    kafka_options: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if environ is None else environ
        options: dict[str, Any] = {
            option: env[name] for name, option in _SECURITY_ENV.items() if env.get(name)
        }
        if env.get("EVSCHED_KAFKA_SSL_CAFILE"):
            # Imported here: only TLS deployments pay for building an SSL context.
            from aiokafka.helpers import create_ssl_context  # noqa: PLC0415

            options["ssl_context"] = create_ssl_context(cafile=env["EVSCHED_KAFKA_SSL_CAFILE"])
        return cls(
            bootstrap=env.get("EVSCHED_KAFKA_BOOTSTRAP", DEFAULT_BOOTSTRAP),
            namespace=env.get("EVSCHED_NAMESPACE", DEFAULT_NAMESPACE),
            event_partitions=int(env.get("EVSCHED_EVENT_PARTITIONS", DEFAULT_EVENT_PARTITIONS)),
            kafka_options=options,
        )
