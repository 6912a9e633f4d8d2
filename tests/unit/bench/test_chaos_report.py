"""The chaos soak's verdict on its rebuild check and its options (bench/chaos.py, pure parts)."""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path
from typing import Any

import pytest

# Appended, not prepended: bench/ holds modules (fold.py, audit.py) that must shadow nothing.
sys.path.append(str(Path(__file__).resolve().parents[3] / "bench"))
chaos: Any = importlib.import_module("chaos")


def compared(node: int, partition: int, offset: int, *, match: bool = True) -> dict[str, Any]:
    return {"node": node, "partition": partition, "offset": offset, "match": match}


def test_every_index_equal_and_at_the_log_end_passes() -> None:
    results = [compared(1, 0, 98), compared(2, 0, 40), compared(2, 1, 9)]
    figures = chaos.rebuild_figures(results, {0: 100, 1: 10})
    assert figures == {
        "digest_match": "true",
        "rebuild_compared": 3,
        "rebuild_mismatched": 0,
        "rebuild_errors": 0,
        "live_behind": 0,
    }


def test_a_mismatch_or_a_failed_rebuild_fails(capsys: pytest.CaptureFixture[str]) -> None:
    mismatch = chaos.rebuild_figures([compared(1, 0, 98, match=False)], {0: 100})
    assert mismatch["digest_match"] == "false" and mismatch["rebuild_mismatched"] == 1
    failed = chaos.rebuild_figures([compared(1, 0, 98), {"node": 2, "error": "exit 4"}], {0: 100})
    assert failed["digest_match"] == "false" and failed["rebuild_errors"] == 1
    assert "exit 4" in capsys.readouterr().out


def test_nothing_compared_does_not_pass() -> None:
    assert chaos.rebuild_figures([], {0: 0})["digest_match"] == "false"


def test_partitions_no_index_reached_are_named(capsys: pytest.CaptureFixture[str]) -> None:
    figures = chaos.rebuild_figures([compared(1, 0, 50), compared(2, 0, 60)], {0: 100, 1: 5})
    assert figures["live_behind"] == 2
    assert figures["digest_match"] == "true"  # equal where compared; live_behind says the rest
    out = capsys.readouterr().out
    assert "p0 reached the log end (60 of 100)" in out and "p1" in out


def test_a_duration_sets_the_number_of_jobs() -> None:
    assert chaos.parse(["--rate", "60", "--duration-s", "120"]).jobs == 7_200
    assert chaos.parse(["--jobs", "300"]).jobs == 300


def test_hostile_kinds_are_checked() -> None:
    assert chaos.parse(["--hostile", "garbage,overflow"]).hostile == ["garbage", "overflow"]
    with pytest.raises(argparse.ArgumentTypeError, match="unknown hostile kinds"):
        chaos._kinds("garbage,nonsense")
