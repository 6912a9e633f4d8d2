"""EVSCHED_KAFKA_CLIENT: which client an EventLog is built on, checked when the factory is made."""

from __future__ import annotations

import pytest

from evsched.adapters.kafka.event_log import KafkaEventLog
from evsched.adapters.kafka.event_log_choice import event_log_factory, kafka_client
from evsched.adapters.kafka.rdkafka_event_log import RdkafkaEventLog
from evsched.adapters.kafka.rdkafka_options import UnsupportedKafkaOption
from evsched.settings import Settings, SettingsError

AIOKAFKA = {"EVSCHED_KAFKA_CLIENT": "aiokafka"}


def test_librdkafka_is_the_default_and_aiokafka_is_chosen_by_name() -> None:
    assert kafka_client({}) == "confluent"
    assert kafka_client({"EVSCHED_KAFKA_CLIENT": ""}) == "confluent"
    assert kafka_client({"EVSCHED_KAFKA_CLIENT": " AIOKafka "}) == "aiokafka"
    assert kafka_client({"EVSCHED_KAFKA_CLIENT": "confluent"}) == "confluent"


@pytest.mark.parametrize("value", ["librdkafka", "kafka-python", "aio kafka", "x" * 200])
def test_a_misspelt_client_names_the_variable_and_the_choices(value: str) -> None:
    with pytest.raises(SettingsError) as refused:
        kafka_client({"EVSCHED_KAFKA_CLIENT": value})
    message = str(refused.value)
    assert "EVSCHED_KAFKA_CLIENT" in message
    assert "aiokafka, confluent" in message
    assert len(message) < 120  # a pasted blob is cut, not echoed whole


def test_the_factory_builds_the_chosen_client() -> None:
    settings = Settings()
    default = event_log_factory(settings, client_id="c", environ={})
    aiokafka = event_log_factory(settings, client_id="c", environ=AIOKAFKA)
    assert isinstance(default(), RdkafkaEventLog)
    assert isinstance(aiokafka(), KafkaEventLog)


def test_options_librdkafka_cannot_take_fail_when_the_factory_is_made() -> None:
    settings = Settings(kafka_options={"sasl_mechanism": "GSSAPI"})
    with pytest.raises(UnsupportedKafkaOption, match=r"GSSAPI.*EVSCHED_KAFKA_CLIENT=aiokafka"):
        event_log_factory(settings, client_id="c", environ={})
    # aiokafka takes GSSAPI: asked for by name, it is not held to librdkafka's limits.
    assert event_log_factory(settings, client_id="c", environ=AIOKAFKA)
