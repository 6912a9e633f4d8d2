"""The side-by-side benchmark's pure parts: start records, figures, the summary, its options."""

from __future__ import annotations

import importlib
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[3] / "bench"
# Appended, not prepended: bench/ holds modules (fold.py, audit.py) that must shadow nothing.
sys.path.append(str(BENCH))
starts: Any = importlib.import_module("starts")
report: Any = importlib.import_module("vs_celery_report")


def test_a_start_log_reads_whole_lines_and_counts_a_redelivered_job_once(tmp_path: Path) -> None:
    path = tmp_path / "starts"
    log = starts.StartLog(path)
    log.poll()  # no file yet: nothing
    path.write_bytes(b"r1-quiet-celery-paced/0 0 5000000000\nr1-quiet-celery-paced/1 40")
    log.poll()
    assert log.count("r1-quiet-celery-paced") == 1
    with path.open("ab") as f:
        f.write(b"00 4100000000\nr1-quiet-celery-paced/0 0 9000000000\nwarm-0/3 0 1\n")
    log.poll()
    paced = log.started("r1-quiet-celery-paced")
    assert sorted(s.started_ns for s in paced) == [4_100_000_000, 5_000_000_000]
    assert [s.lateness_ms for s in paced if s.run_at_ms] == [100.0]
    assert log.count("warm-0") == 1 and log.started("absent") == []


def test_record_appends_when_the_bench_names_a_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(starts.STARTS_ENV, raising=False)
    starts.record("p/0", 0)  # no file named: a no-op
    path = tmp_path / "starts"
    monkeypatch.setenv(starts.STARTS_ENV, str(path))
    starts.record("p/1", 123)
    tag, run_at_ms, started_ns = path.read_text().split()
    assert (tag, run_at_ms) == ("p/1", "123") and int(started_ns) > 0


def figures(side: str, kind: str, late_ms: list[float], **extra: Any) -> Any:
    """A phase whose delayed jobs were due at 10 s and started ``late_ms`` later, one at once."""
    started = [starts.Start(10_000, int((10_000 + late) * 1e6)) for late in late_ms]
    started.append(starts.Start(0, 12_000_000_000))
    cpu = {"broker": 1.0, "node": 2.0, "worker": 3.0, "client": 4.0, "rest": 9.0}
    values = {"enqueue_ms": [1.0, 2.0, 3.0], "first_enqueue_ms": 8_000, "cpu_s": cpu} | extra
    return report.Figures(
        side=side, condition="quiet", kind=kind, round=1, starts=started, **values
    )


def test_a_phase_counts_early_starts_and_measures_from_the_first_enqueue() -> None:
    f = figures("evsched", "burst", [-1.0, 5.0, 15.0], records={"ns.events": 12, "ns.d": 4})
    assert f.jobs == 4 and f.early == 1
    assert f.lateness_ms == pytest.approx([-1.0, 5.0, 15.0])
    assert f.jobs_per_s == pytest.approx(4 / 4.0)  # first enqueue at 8 s, last start at 12 s
    assert f.cpu_per_1k() == pytest.approx(10 / 4 * 1000)
    assert f.cpu_per_1k("node") == pytest.approx(500.0)
    assert f.records_per_job == 4.0
    line = report.phase_line(f)
    assert "1 jobs/s" in line and "early=1" in line and "records/job 4.00" in line
    assert "ns.events=3.00" in line
    paced = report.phase_line(figures("celery", "paced", []))
    assert "enqueue p50=2.00" in paced and "lateness" not in paced
    assert report.Figures("c", "q", "burst", 1, [], [], 0, {}).jobs_per_s == 0.0


def test_the_ratios_are_evsched_over_celery() -> None:
    ev = figures("evsched", "paced", [10.0] * 10, enqueue_ms=[4.0] * 10)
    ce = figures("celery", "paced", [5.0] * 10, enqueue_ms=[2.0] * 10)
    line = report.ratio_line(ev, ce)
    assert "enqueue p99 x2.00" in line and "lateness p99 x2.00" in line
    assert "cpu/1k jobs x1.00" in line
    burst = report.ratio_line(figures("evsched", "burst", []), figures("celery", "burst", []))
    assert "jobs/s x1.00" in burst and "lateness p99 xnan" in burst


def test_the_summary_takes_medians_and_the_share_of_the_kafka_bound() -> None:
    rounds = [
        figures("evsched", "burst", [1.0], records={"ns.events": 10}),
        figures("celery", "burst", [2.0]),
        figures("evsched", "paced", [3.0]),
        figures("celery", "paced", [-4.0]),
    ]
    bound_line = report.bound_line(1, "quiet", 10.0, rounds[0])
    assert "5.00 records per job = 2 jobs/s" in bound_line
    pairs = dict(kv.split("=") for kv in report.summary(rounds, {"quiet": [10.0]}).split())
    assert pairs["quiet_records_per_job"] == "5.00"
    assert pairs["quiet_kafka_bound_records_per_s"] == "10"
    assert pairs["quiet_celery_early"] == "1.00" and pairs["quiet_evsched_early"] == "0.00"
    assert pairs["quiet_evsched_lateness_p99_ms"] == "3.00"
    assert pairs["quiet_jobs_ratio"] == "1.00"
    assert float(pairs["quiet_evsched_of_bound_pct"]) == pytest.approx(100 * 0.5 / 2)
    assert pairs["quiet_celery_burst_cpu_worker_s_per_1k"] == "1500.00"
    assert math.isnan(report._median([float("nan")]))


def test_the_bench_imports_and_parses_without_celery_or_redis_installed() -> None:
    # CI installs no bench extra: only running the bench may need Celery and redis-py.
    code = (
        "import sys; sys.modules['celery'] = None; sys.modules['redis'] = None; "
        f"sys.path.append({str(BENCH)!r}); import vs_celery; "
        "a = vs_celery.parse(['--rounds', '1', '--conditions', 'hog']); print(a.rounds, a.rate)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["1", "500.0"]
    busy = code.replace("'hog'", "'busy'")
    bad = subprocess.run([sys.executable, "-c", busy], capture_output=True, text=True, check=False)
    assert bad.returncode == 2 and "--conditions: unknown busy" in bad.stderr
