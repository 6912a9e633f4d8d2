"""EVSCHED_KAFKA_CLIENT: which client an EventLog is built on, checked when the factory is made."""

from __future__ import annotations

import pytest

from evsched.adapters.kafka.event_log import KafkaEventLog
from evsched.adapters.kafka.event_log_choice import event_log_factory, kafka_client
from evsched.adapters.kafka.rdkafka_event_log import RdkafkaEventLog
from evsched.adapters.kafka.rdkafka_options import UnsupportedKafkaOption
from evsched.settings import Settings, SettingsError

CONFLUENT = {"EVSCHED_KAFKA_CLIENT": "confluent"}


def test_aiokafka_stays_the_default_and_a_misspelt_client_is_refused() -> None:
    assert kafka_client({}) == "aiokafka"
    assert kafka_client({"EVSCHED_KAFKA_CLIENT": ""}) == "aiokafka"
    assert kafka_client({"EVSCHED_KAFKA_CLIENT": " Confluent "}) == "confluent"
    with pytest.raises(SettingsError, match="EVSCHED_KAFKA_CLIENT"):
        kafka_client({"EVSCHED_KAFKA_CLIENT": "librdkafka"})


def test_the_factory_builds_the_chosen_client() -> None:
    settings = Settings()
    default = event_log_factory(settings, client_id="c", environ={})
    confluent = event_log_factory(settings, client_id="c", environ=CONFLUENT)
    assert isinstance(default(), KafkaEventLog)
    assert isinstance(confluent(), RdkafkaEventLog)


def test_options_librdkafka_cannot_take_fail_when_the_factory_is_made() -> None:
    settings = Settings(kafka_options={"sasl_mechanism": "GSSAPI"})
    with pytest.raises(UnsupportedKafkaOption, match="GSSAPI"):
        event_log_factory(settings, client_id="c", environ=CONFLUENT)
    # aiokafka takes GSSAPI: the default client is not held to librdkafka's limits.
    assert event_log_factory(settings, client_id="c", environ={})
