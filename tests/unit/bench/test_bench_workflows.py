"""The workflow benchmark's pure parts (bench/workflows.py): figures from log times, options."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[3] / "bench"
# Appended, not prepended: bench/ holds modules (fold.py, audit.py) that must shadow nothing.
sys.path.append(str(BENCH))
bench: Any = importlib.import_module("workflows")
e2e: Any = importlib.import_module("e2e")


def times(run_at: int, leased: int, started: int, succeeded: int) -> Any:
    return e2e.JobTimes(run_at=run_at, leased_at=leased, started_at=started, succeeded_at=succeeded)


def test_hops_chains_groups_and_the_baseline_come_from_the_log_times() -> None:
    runs = bench.Runs(singles=["s"], chains=[["a", "b", "c"]], groups=[["m1", "m2", "cb"]])
    log = {
        "s": times(1_000, 1_004, 1_010, 1_011),
        # A chain: each step enqueued at 0, released and leased after its parent's success.
        "a": times(0, 2, 5, 6),
        "b": times(0, 10, 16, 17),
        "c": times(0, 20, 27, 30),
        # A group: members and callback enqueued at 100 (one transaction).
        "m1": times(100, 101, 103, 104),
        "m2": times(100, 101, 103, 120),
        "cb": times(100, 125, 131, 140),
    }
    f = bench.figures(runs, log)
    assert f.baseline == [10.0]
    assert f.hop == [10.0, 10.0]  # b started 10 after a's success, c 10 after b's
    assert f.hop_lease == [4.0, 3.0] and f.hop_start == [6.0, 7.0]
    assert f.chain == [30.0]  # a's enqueue to c's success
    assert f.group == [40.0] and f.fan_in == [11.0]  # the last member ended at 120


def test_a_job_without_an_applied_start_fails_loudly() -> None:
    runs = bench.Runs(singles=["s"])
    with pytest.raises(RuntimeError, match="no applied start"):
        bench.figures(runs, {"s": e2e.JobTimes(run_at=5)})


def test_the_options_set_what_e2es_cluster_and_warm_up_read() -> None:
    args = bench.parse(["--rounds", "1", "--chains", "10", "--group-size", "50"])
    assert (args.rounds, args.chains, args.chain_length, args.group_size) == (1, 10, 10, 50)
    assert (args.delay_s, args.delayed_share, args.rss, args.profile) == (0.0, 0.0, False, None)
    assert args.nodes == args.workers == 1 and args.partitions == 6
