"""Issue 9 follow-up: a namespace is refused at start-up unless every queue's topic name fits."""

from __future__ import annotations

import pytest

from evsched.adapters.kafka.topics import Topics
from evsched.core import bounds
from evsched.settings import Settings, SettingsError

LONGEST_QUEUE = "q" * bounds.MAX_QUEUE_CHARS


def test_the_namespace_limit_leaves_room_for_the_longest_queue() -> None:
    assert bounds.MAX_NAMESPACE_CHARS == 39
    topic = Topics("n" * 39).dispatch(LONGEST_QUEUE)
    assert len(topic) == bounds.MAX_TOPIC_CHARS


@pytest.mark.parametrize(
    ("namespace", "why"),
    [
        ("n" * 40, "namespace has 40 characters, above the limit of 39"),
        ("", "must be non-empty and only [A-Za-z0-9._-]"),
        ("team/a", "'team/a' must be non-empty and only [A-Za-z0-9._-]"),
        ("é", "must be non-empty and only [A-Za-z0-9._-]"),
    ],
)
def test_settings_refuse_a_namespace_no_topic_name_can_hold(namespace: str, why: str) -> None:
    with pytest.raises(SettingsError, match=r"^EVSCHED_NAMESPACE=") as caught:
        Settings.from_env({"EVSCHED_NAMESPACE": namespace})
    assert why in str(caught.value)
    with pytest.raises(SettingsError, match="EVSCHED_NAMESPACE"):
        Settings(namespace=namespace)


def test_settings_accept_the_longest_legal_namespace() -> None:
    assert Settings.from_env({"EVSCHED_NAMESPACE": "a.b-c_D9" + "x" * 31}).namespace.endswith("x")


def test_namespace_refusal_of_a_value_of_the_wrong_type() -> None:
    assert bounds.namespace_refusal(None) is not None  # type: ignore[arg-type]
    assert bounds.namespace_refusal("ok") is None


@pytest.mark.parametrize(
    "queue", [LONGEST_QUEUE + "q", "", "a/b", "q" * (249 - len(".dispatch.") - 2)]
)
def test_topic_names_refuse_the_queues_the_fold_refuses(queue: str) -> None:
    # The fold and the API refuse these queues: no topic is ever named after them either.
    assert bounds.queue_refusal(queue) is not None
    with pytest.raises(ValueError, match="can't be part of a Kafka topic name: queue"):
        Topics("ns").dispatch(queue)


def test_topic_names_accept_the_queues_the_fold_accepts() -> None:
    assert bounds.queue_refusal(LONGEST_QUEUE) is None
    assert Topics("ns").dispatch(LONGEST_QUEUE) == f"ns.dispatch.{LONGEST_QUEUE}"
