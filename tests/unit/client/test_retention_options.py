"""Retention and key-window options: the namespace's settings, per-call options, and bad input."""

from __future__ import annotations

from datetime import timedelta

import pytest
from pydantic import ValidationError

from evsched.api.models import EnqueueRequest
from evsched.commands import EnqueueOptions, TaskSpec, build_enqueue
from evsched.errors import InvalidEnqueue
from evsched.settings import Settings, SettingsError

SPEC = TaskSpec(name="t")


def enqueue(options: EnqueueOptions, defaults: Settings | None = None) -> tuple[object, object]:
    event = build_enqueue(
        SPEC, b"[]", options, now_ms=1_000, new_id=lambda: "id-1", defaults=defaults
    )
    return event.retention_ms, event.key_window_ms


def test_the_windows_come_from_the_call_then_the_namespace_then_the_fold() -> None:
    namespace = Settings(retention_ms=120_000, key_window_ms=60_000)

    assert enqueue(EnqueueOptions()) == (None, None)  # the fold's defaults: 7 days and 24 h
    assert enqueue(EnqueueOptions(), namespace) == (120_000, 60_000)
    options = EnqueueOptions(retention=timedelta(hours=1), key_window=1.5)
    assert enqueue(options, namespace) == (3_600_000, 1_500)


@pytest.mark.parametrize("field", ["retention", "key_window"])
def test_a_negative_window_is_refused_naming_the_option(field: str) -> None:
    with pytest.raises(InvalidEnqueue) as caught:
        enqueue(EnqueueOptions(**{field: -1}))  # type: ignore[arg-type]
    assert caught.value.field == field


def test_the_settings_read_and_check_the_environment() -> None:
    env = {"EVSCHED_RETENTION_MS": "120000", "EVSCHED_KEY_WINDOW_MS": "0"}
    settings = Settings.from_env(env)
    assert (settings.retention_ms, settings.key_window_ms) == (120_000, 0)
    assert Settings.from_env({}).retention_ms is None
    for bad in ("-1", "2m", str(400 * 365 * 86_400_000)):
        with pytest.raises(SettingsError, match="EVSCHED_RETENTION_MS"):
            Settings.from_env({"EVSCHED_RETENTION_MS": bad})


def test_the_api_refuses_a_negative_retention_naming_the_field() -> None:
    with pytest.raises(ValidationError, match="retention_s"):
        EnqueueRequest.model_validate({"task": "t", "retention_s": -1.0})
    ok = EnqueueRequest.model_validate({"task": "t", "retention_s": 60.0, "key_window_s": 0.0})
    assert (ok.retention_s, ok.key_window_s) == (60.0, 0.0)


def test_an_empty_number_is_the_default_except_for_the_partition_count() -> None:
    blank = {
        "EVSCHED_REPLICATION_FACTOR": " ",
        "EVSCHED_RETENTION_MS": "",
        "EVSCHED_KEY_WINDOW_MS": "",
    }
    settings = Settings.from_env(blank)
    assert (settings.replication_factor, settings.retention_ms, settings.key_window_ms) == (
        None,
        None,
        None,
    )
    assert Settings.from_env({"EVSCHED_EVENT_PARTITIONS": " 3 "}).event_partitions == 3
    for bad in ("", "0", "six"):
        with pytest.raises(SettingsError, match="EVSCHED_EVENT_PARTITIONS"):
            Settings.from_env({"EVSCHED_EVENT_PARTITIONS": bad})
