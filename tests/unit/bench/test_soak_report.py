"""The soak benchmark's verdicts (bench/soak_report.py): flat after warm-up, per-chunk figures."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Any

# Appended, not prepended: bench/ holds modules (fold.py, audit.py) that must shadow nothing.
sys.path.append(str(Path(__file__).resolve().parents[3] / "bench"))
soak: Any = importlib.import_module("soak_report")


def samples(values: list[float], name: str = "node_rss_mb", every_s: float = 10.0) -> list[Any]:
    return [soak.Sample(i * every_s, i * 100, {name: v}) for i, v in enumerate(values)]


def test_warm_up_growth_is_not_judged_and_a_flat_rest_is_flat() -> None:
    found = soak.flatness(samples([10, 50, 90, 100, 104, 98, 101, 99, 103]), 30.0, "node_rss_mb")
    assert found.flat
    assert found.low == 98 and found.high == 104


def test_a_creep_after_warm_up_is_not_flat() -> None:
    creeping = [100.0 + 3 * i for i in range(12)]
    found = soak.flatness(samples(creeping), 0.0, "node_rss_mb")
    assert not found.flat
    assert found.change_pct > 10


def test_one_spike_does_not_decide_flatness() -> None:
    found = soak.flatness(samples([100, 101, 99, 180, 100, 102, 100, 99, 101]), 0.0, "node_rss_mb")
    assert found.flat
    assert found.high == 180


def test_too_few_samples_after_warm_up_give_no_verdict() -> None:
    assert soak.flatness(samples([1, 2, 3, 4]), 25.0, "node_rss_mb") is None


def test_report_gives_the_first_and_last_chunks_percentiles(capsys: Any) -> None:
    chunks = soak.Chunks(size=2)
    for i, ms in enumerate([1.0, 3.0, 5.0, 7.0]):
        chunks.of(i).enqueue_ms.append(ms)
        chunks.of(i).lateness_ms.append(ms * 10)
    rows = [soak.Sample(float(t), t, dict.fromkeys(soak.SAMPLED, 100.0)) for t in range(6)]
    figures = soak.report(rows, chunks, warmup_s=0.0)
    assert figures["flat"] == "true"
    assert figures["enqueue_p50_first_ms"] == 2.0
    assert figures["enqueue_p50_last_ms"] == 6.0
    assert figures["lateness_p99_last_ms"] < 70.1
    assert "jobs         2-        3" in capsys.readouterr().out


def test_report_says_not_flat_when_one_resource_grew() -> None:
    chunks = soak.Chunks(size=10)
    chunks.of(0).enqueue_ms.append(1.0)
    rows = [
        soak.Sample(float(t), t, {**dict.fromkeys(soak.SAMPLED, 100.0), "api_disk_mb": 100.0 + t})
        for t in range(30)
    ]
    figures = soak.report(rows, chunks, warmup_s=0.0)
    assert figures["flat"] == "false"
    assert figures["api_disk_mb_change_pct"] > 10


def test_dir_mb_counts_allocated_bytes(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "f").write_bytes(b"x" * (1 << 20))
    assert 0.9 < soak.dir_mb(tmp_path) < 1.2
    assert soak.dir_mb(tmp_path / "missing") == 0.0


def test_dir_mb_counts_only_the_files_of_a_suffix(tmp_path: Path) -> None:
    (tmp_path / "000007.sst").write_bytes(b"x" * (1 << 20))
    (tmp_path / "LOG").write_bytes(b"x" * (2 << 20))
    assert 0.9 < soak.dir_mb(tmp_path, ".sst") < 1.2
    assert 2.9 < soak.dir_mb(tmp_path) < 3.2
