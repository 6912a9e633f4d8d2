"""The consumer groups' failure detection: defaults, and the settings that override them."""

from __future__ import annotations

import pytest

from evsched.adapters.kafka.clients import GROUP_TIMEOUTS, group_timeouts
from evsched.settings import Settings, SettingsError


def test_the_defaults_detect_a_killed_member_after_six_seconds() -> None:
    assert group_timeouts(Settings()) == GROUP_TIMEOUTS
    assert GROUP_TIMEOUTS["session_timeout_ms"] == 6_000


def test_the_environment_sets_the_session_timeout_and_heartbeat() -> None:
    env = {"EVSCHED_SESSION_TIMEOUT_MS": "3000", "EVSCHED_HEARTBEAT_INTERVAL_MS": "250"}
    timeouts = group_timeouts(Settings.from_env(env))
    assert timeouts["session_timeout_ms"] == 3_000
    assert timeouts["heartbeat_interval_ms"] == 250
    assert timeouts["rebalance_timeout_ms"] == GROUP_TIMEOUTS["rebalance_timeout_ms"]


def test_a_short_session_gets_heartbeats_a_third_of_it_apart() -> None:
    timeouts = group_timeouts(Settings.from_env({"EVSCHED_SESSION_TIMEOUT_MS": "1500"}))
    assert timeouts["heartbeat_interval_ms"] == 500


def test_blank_means_the_default() -> None:
    settings = Settings.from_env({"EVSCHED_SESSION_TIMEOUT_MS": " "})
    assert group_timeouts(settings) == GROUP_TIMEOUTS


@pytest.mark.parametrize("value", ["0", "-5", "six"])
def test_a_bad_session_timeout_names_the_variable(value: str) -> None:
    with pytest.raises(SettingsError, match="EVSCHED_SESSION_TIMEOUT_MS"):
        Settings.from_env({"EVSCHED_SESSION_TIMEOUT_MS": value})
