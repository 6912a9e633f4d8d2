"""The collector's settings in evsched's processes, and the on/off switches of process tuning.

Tuning runs in a child, so this test process keeps CPython's defaults."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from typing import Any

import pytest

from evsched.runtime.process import allocator
from evsched.runtime.process.gc_policy import YOUNG_THRESHOLD, tune_collector
from evsched.settings import (
    GC_TUNING_ENV,
    MALLOC_TUNING_ENV,
    Settings,
    SettingsError,
    switch_env,
)

# Prints the thresholds and how many objects are frozen before and after tuning.
TUNED = textwrap.dedent(
    """
    import gc, json, sys
    from evsched.runtime.process.gc_policy import tune_collector
    thresholds, frozen = gc.get_threshold(), gc.get_freeze_count()
    tuned = tune_collector({"EVSCHED_GC_TUNING": sys.argv[1]})
    print(json.dumps([tuned, thresholds, gc.get_threshold(), frozen, gc.get_freeze_count()]))
    """
)


def _child(switch: str) -> list[Any]:
    done = subprocess.run(
        [sys.executable, "-c", TUNED, switch], capture_output=True, text=True, check=True
    )
    found: list[Any] = json.loads(done.stdout)
    return found


def test_tuning_freezes_the_imports_and_collects_young_objects_less_often() -> None:
    tuned, _, thresholds, frozen_before, frozen_after = _child("on")
    assert tuned is True
    assert thresholds == [YOUNG_THRESHOLD, 50, 100]
    assert frozen_before == 0
    assert frozen_after > 10_000  # evsched's imports: modules, functions, classes


def test_the_switch_keeps_cpythons_defaults() -> None:
    tuned, defaults, thresholds, frozen_before, frozen_after = _child("off")
    assert tuned is False
    assert thresholds == defaults  # a fresh interpreter's: CPython's own
    assert frozen_before == frozen_after == 0


@pytest.mark.parametrize("value", ["", "on", "1", " TRUE ", "yes"])
def test_a_switch_is_on_unless_turned_off(value: str) -> None:
    assert switch_env({GC_TUNING_ENV: value}, GC_TUNING_ENV)
    assert switch_env({}, GC_TUNING_ENV)


@pytest.mark.parametrize("value", ["off", "0", "False", "no"])
def test_a_switch_turned_off(value: str) -> None:
    assert not switch_env({MALLOC_TUNING_ENV: value}, MALLOC_TUNING_ENV)


@pytest.mark.parametrize("name", [GC_TUNING_ENV, MALLOC_TUNING_ENV])
def test_a_misspelt_switch_is_refused_naming_it(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(SettingsError, match=rf"{name}='of': expected on or off"):
        switch_env({name: "of"}, name)
    # Every process reads its settings first: the misspelling stops it there, before tuning.
    with pytest.raises(SettingsError, match=name):
        Settings.from_env({name: "disabled"})
    monkeypatch.setenv(name, "disabled")
    with pytest.raises(SettingsError, match=name):
        tune_collector() if name == GC_TUNING_ENV else allocator.tune_allocator(trim_every_s=None)
