"""Which Kafka client an EventLog is built on: ``EVSCHED_KAFKA_CLIENT=confluent|aiokafka``.

librdkafka (``confluent``, ``rdkafka_event_log``) is the default: a tenth of aiokafka's CPU per
record (issue 33). ``aiokafka`` keeps the pure-Python client, for options librdkafka cannot be
given (docs/operations.md, "Kafka clients"). Each is imported only when chosen.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping

from evsched.ports import EventLog
from evsched.settings import Settings, SettingsError

KAFKA_CLIENT_ENV = "EVSCHED_KAFKA_CLIENT"
CLIENTS = ("aiokafka", "confluent")
DEFAULT_CLIENT = "confluent"


def kafka_client(environ: Mapping[str, str] | None = None) -> str:
    """The client ``EVSCHED_KAFKA_CLIENT`` names (unset or empty: confluent); SettingsError for
    any other value, naming the variable and the choices."""
    env = os.environ if environ is None else environ
    value = env.get(KAFKA_CLIENT_ENV, "").strip().lower() or DEFAULT_CLIENT
    if value not in CLIENTS:
        raise SettingsError(
            f"{KAFKA_CLIENT_ENV}={value[:40]!r}: expected one of {', '.join(CLIENTS)}"
        )
    return value


def event_log_factory(
    settings: Settings, *, client_id: str, environ: Mapping[str, str] | None = None
) -> Callable[[], EventLog]:
    """Makes EventLogs on the chosen client; the choice (and, for confluent, the translation of
    ``settings.kafka_options``) is checked now, so a bad setting fails before the first write."""
    if kafka_client(environ) == "aiokafka":
        from evsched.adapters.kafka.event_log import KafkaEventLog  # noqa: PLC0415

        return lambda: KafkaEventLog(settings, client_id=client_id)
    from evsched.adapters.kafka.rdkafka_event_log import RdkafkaEventLog  # noqa: PLC0415
    from evsched.adapters.kafka.rdkafka_options import rdkafka_config  # noqa: PLC0415

    rdkafka_config(settings.kafka_options)  # UnsupportedKafkaOption now, not at the first write
    return lambda: RdkafkaEventLog(settings, client_id=client_id)
