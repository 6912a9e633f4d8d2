"""Process settings read from the environment (``EVSCHED_*``), with defaults for a local stack."""

from __future__ import annotations

import os
from dataclasses import dataclass

DEFAULT_BROKER_PORT = 19092
DEFAULT_CONTROLLER_PORT = 19093
DEFAULT_BOOTSTRAP = f"127.0.0.1:{DEFAULT_BROKER_PORT}"
DEFAULT_NAMESPACE = "evsched"
DEFAULT_EVENT_PARTITIONS = 6


@dataclass(frozen=True, slots=True, kw_only=True)
class Settings:
    bootstrap: str = DEFAULT_BOOTSTRAP
    namespace: str = DEFAULT_NAMESPACE
    event_partitions: int = DEFAULT_EVENT_PARTITIONS

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> Settings:
        env = os.environ if environ is None else environ
        return cls(
            bootstrap=env.get("EVSCHED_KAFKA_BOOTSTRAP", DEFAULT_BOOTSTRAP),
            namespace=env.get("EVSCHED_NAMESPACE", DEFAULT_NAMESPACE),
            event_partitions=int(env.get("EVSCHED_EVENT_PARTITIONS", DEFAULT_EVENT_PARTITIONS)),
        )
