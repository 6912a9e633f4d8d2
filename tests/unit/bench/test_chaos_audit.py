"""The chaos soak's auditor (bench/chaos_audit.py) on hand-made topic contents."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Any

from evsched.core.events import (
    AttemptFailed,
    AttemptStarted,
    AttemptSucceeded,
    Effect,
    Event,
    JobEnqueued,
    JobLeased,
    LeaseExpired,
    LeaseRenewed,
)

# Appended, not prepended: bench/ holds modules (fold.py, audit.py) that must shadow nothing.
sys.path.append(str(Path(__file__).resolve().parents[3] / "bench"))
chaos_audit: Any = importlib.import_module("chaos_audit")
LogRecord, Fault = chaos_audit.LogRecord, chaos_audit.Fault

EFFECT = (Effect(kind="done", payload=b"{}"),)


class Log:
    """Builds one partition's records in order, stamping offsets and log times."""

    def __init__(self, partition: int = 0) -> None:
        self.partition = partition
        self.records: list[Any] = []
        self._ids = 0

    def _id(self) -> str:
        self._ids += 1
        return f"e{self.partition}-{self._ids}"

    def add(self, event: Event | None, at: int) -> Log:
        offset = len(self.records)
        self.records.append(LogRecord(self.partition, offset, at, event))
        return self

    def enqueue(self, job: str, at: int, max_attempts: int = 3) -> Log:
        event = JobEnqueued(
            event_id=self._id(),
            job_id=job,
            emitted_at=at,
            source="client",
            task="t",
            queue="default",
            args=b"[]",
            max_attempts=max_attempts,
        )
        return self.add(event, at)

    def lease(self, job: str, token: int, attempt: int, at: int, lease_ms: int = 1_000) -> Log:
        event = JobLeased(
            event_id=self._id(),
            job_id=job,
            emitted_at=at,
            source="node-1",
            token=token,
            attempt=attempt,
            lease_ms=lease_ms,
        )
        return self.add(event, at)

    def start(self, job: str, token: int, at: int, worker: str = "w1") -> Log:
        event = AttemptStarted(
            event_id=self._id(),
            job_id=job,
            emitted_at=at,
            source=worker,
            token=token,
            worker_id=worker,
            lease_ms=5_000,
        )
        return self.add(event, at)

    def renew(self, job: str, token: int, at: int) -> Log:
        event = LeaseRenewed(
            event_id=self._id(), job_id=job, emitted_at=at, source="w", token=token, lease_ms=5_000
        )
        return self.add(event, at)

    def succeed(self, job: str, token: int, at: int, event_id: str | None = None) -> Log:
        event = AttemptSucceeded(
            event_id=event_id or self._id(),
            job_id=job,
            emitted_at=at,
            source="w",
            token=token,
            result=b"null",
            effects=EFFECT,
        )
        return self.add(event, at)

    def fail(self, job: str, token: int, at: int, *, retryable: bool = True) -> Log:
        event = AttemptFailed(
            event_id=self._id(),
            job_id=job,
            emitted_at=at,
            source="w",
            token=token,
            error_type="E",
            message="m",
            retryable=retryable,
        )
        return self.add(event, at)

    def expire(self, job: str, token: int, at: int) -> Log:
        event = LeaseExpired(
            event_id=self._id(), job_id=job, emitted_at=at, source="n", token=token
        )
        return self.add(event, at)

    def done(self, job: str, token: int, at: int) -> Log:
        return (
            self.enqueue(job, at)
            .lease(job, token, 1, at + 1)
            .start(job, token, at + 2)
            .succeed(job, token, at + 3)
        )


def audit(log: Log, acknowledged: set[str], effects: list[tuple[str, int, int]], **kw: Any) -> Any:
    auditor = chaos_audit.Auditor(acknowledged=acknowledged, **kw)
    return auditor.feed_all(log.records).effects(effects)


def test_a_clean_history_has_no_findings() -> None:
    log = Log().done("a", 1, 100).done("b", 1, 200)
    found = audit(log, {"a", "b"}, [("a", 1, 0), ("b", 1, 0)]).findings()
    figures = found.figures()
    assert figures["succeeded"] == 2
    for key in ("lost", "dup_successes", "dup_effects", "stale_effects", "missing_effects"):
        assert figures[key] == 0, key
    assert figures["dead_unstarted"] == figures["late_starts"] == 0


def test_an_acknowledged_job_never_terminal_is_lost() -> None:
    log = Log().done("a", 1, 100).enqueue("b", 200).lease("b", 1, 1, 201)
    found = audit(log, {"a", "b", "never-written"}, [("a", 1, 0)]).findings()
    assert found.lost == ["b", "never-written"]


def test_effects_from_two_tokens_are_a_duplicate_accepted_success() -> None:
    # The model accepts only the first success; the second token's effect means a node accepted
    # a second success (or published a stale one): both are reported.
    log = Log().done("a", 1, 100).succeed("a", 2, 110)
    found = audit(log, {"a"}, [("a", 1, 0), ("a", 2, 0)]).findings()
    assert found.duplicate_successes == ["a"]
    assert found.stale_effects == [("a", 2, 0)]


def test_a_stale_token_success_is_not_accepted_and_its_effect_is_stale() -> None:
    log = Log().enqueue("a", 0).lease("a", 1, 1, 1).start("a", 1, 2)
    log.expire("a", 1, 6_000).lease("a", 2, 2, 7_000).start("a", 2, 7_001)
    log.succeed("a", 1, 7_002).succeed("a", 2, 7_003)
    found = audit(log, {"a"}, [("a", 1, 0), ("a", 2, 0)]).findings()
    assert found.stale_effects == [("a", 1, 0)]
    assert found.duplicate_successes == ["a"]
    assert found.lost == []


def test_an_effect_published_twice_and_a_missing_one() -> None:
    log = Log().done("a", 1, 100).done("b", 1, 200)
    found = audit(log, {"a", "b"}, [("a", 1, 0), ("a", 1, 0)]).findings()
    assert found.duplicate_effects == [("a", 1, 0)]
    assert found.missing_effects == [("b", 1, 0)]


def test_a_producer_retry_of_a_success_is_applied_once() -> None:
    log = Log().done("a", 1, 100).succeed("a", 1, 104, event_id="e0-4")
    found = audit(log, {"a"}, [("a", 1, 0)]).findings()
    assert found.stale_effects == found.duplicate_successes == []


def test_expiries_of_leases_never_started_spend_no_attempt() -> None:
    # Fold version 2: each unstarted expiry gives the attempt back, so attempt 1 is leased again.
    log = Log().enqueue("a", 0, max_attempts=1)
    log.lease("a", 1, 1, 10).expire("a", 1, 1_010).lease("a", 2, 1, 2_000).expire("a", 2, 3_000)
    log.lease("a", 3, 1, 3_100).start("a", 3, 3_200).succeed("a", 3, 3_300)
    found = audit(log, {"a"}, [("a", 3, 0)]).findings()
    assert found.unstarted_expiries == 2 and found.refused_leases == 0
    assert found.succeeded == 1 and found.dead_unstarted == found.lost == []


def test_a_lease_that_spent_an_attempt_on_an_unstarted_expiry_is_refused() -> None:
    log = Log().enqueue("a", 0, max_attempts=2)
    log.lease("a", 1, 1, 10).expire("a", 1, 1_010).lease("a", 2, 2, 2_000)
    found = audit(log, {"a"}, []).findings()
    assert found.refused_leases == 1 and found.lost == ["a"]


def test_an_expiry_before_the_lease_ends_is_not_applied() -> None:
    log = Log().enqueue("a", 0).lease("a", 1, 1, 10, lease_ms=1_000).expire("a", 1, 500)
    found = audit(log, {"a"}, []).findings()
    assert found.unstarted_expiries == 0 and found.lost == ["a"]


def test_starts_past_the_deadline_and_after_the_end_are_counted() -> None:
    # The late start is not applied (the fold refuses it too): the expiry after it spends no
    # attempt, and attempt 1 is leased again under token 2.
    log = Log().enqueue("a", 0).lease("a", 1, 1, 10, lease_ms=1_000).start("a", 1, 2_000)
    log.expire("a", 1, 2_100).lease("a", 2, 1, 2_200).start("a", 2, 2_300)
    log.succeed("a", 2, 2_400).start("a", 2, 2_500)
    found = audit(log, {"a"}, [("a", 2, 0)]).findings()
    assert found.late_starts == 1 and found.late_start_max_ms == 990
    assert found.starts_after_terminal == 1
    assert found.unstarted_expiries == 1 and found.refused_leases == 0
    assert found.succeeded == 1 and found.lost == [] and found.stale_effects == []


def test_a_start_logged_exactly_at_its_deadline_is_late() -> None:
    log = Log().enqueue("a", 0).lease("a", 1, 1, 10, lease_ms=1_000).start("a", 1, 1_010)
    log.renew("a", 1, 1_100).succeed("a", 1, 1_200)
    found = audit(log, {"a"}, [("a", 1, 0)]).findings()
    assert found.late_starts == 1 and found.late_start_max_ms == 0
    assert found.lost == ["a"] and found.stale_effects != []


def test_a_permanent_failure_is_dead_with_a_start() -> None:
    log = Log().enqueue("a", 0).lease("a", 1, 1, 10).start("a", 1, 20)
    log.fail("a", 1, 30, retryable=False)
    found = audit(log, {"a"}, []).findings()
    assert found.dead == 1 and found.dead_unstarted == []


def test_undecodable_records_and_injected_jobs() -> None:
    log = Log().add(None, 5).add(None, 6).enqueue("forged", 7).done("a", 1, 100)
    found = audit(log, {"a"}, [("a", 1, 0)], injected={"forged"}, injected_garbage=2).findings()
    figures = found.figures()
    assert figures["undecodable"] == figures["injected_garbage"] == 2
    auditor = audit(log, set(), [("forged", 1, 0)], injected={"forged"})
    assert "forged" not in auditor.jobs
    assert auditor.findings().stale_effects == []


def test_a_node_kill_stalls_its_partitions_until_their_next_lease() -> None:
    p0, p1 = Log(0), Log(1)
    p0.done("a", 1, 1_000).done("b", 1, 9_000)
    p1.done("c", 1, 1_000).done("d", 1, 4_000)
    auditor = chaos_audit.Auditor(acknowledged=set()).feed_all(p0.records + p1.records)
    stalls = auditor.stalls([Fault("node", 2_000, partitions=frozenset({0, 1}))])
    assert stalls["node"] == [7.001]
    # From each partition's last lease before the kill (p0's at 1,000 ms) to its first after.
    assert stalls["node_gap"] == [8.0]


def test_a_worker_kill_stalls_the_jobs_in_flight_until_they_start_again() -> None:
    log = Log().enqueue("a", 0).lease("a", 1, 1, 10).start("a", 1, 20, worker="w9-1")
    log.expire("a", 1, 5_100).lease("a", 2, 2, 6_000).start("a", 2, 6_010, worker="w2-1")
    log.succeed("a", 2, 7_000)
    # b was leased before the kill and started after it, elsewhere: it waited too.
    log.enqueue("b", 900).lease("b", 1, 1, 950).start("b", 1, 3_000, worker="w2-1")
    log.succeed("b", 1, 3_001)
    # c ran on another worker, d finished before the kill: neither was held up.
    log.enqueue("c", 900).lease("c", 1, 1, 950).start("c", 1, 960, worker="w2-1")
    log.succeed("c", 1, 9_000).done("d", 1, 100)
    auditor = chaos_audit.Auditor(acknowledged=set()).feed_all(log.records)
    faults = [Fault("worker", 1_000, worker_id="w9-"), Fault("worker", 8_000, worker_id="w5-")]
    assert auditor.stalls(faults)["worker"] == [5.01]
    figures = auditor.findings(faults).figures()
    assert figures["worker_stalls_measured"] == 1 and figures["worker_stall_max_s"] == 5.01
    assert figures["node_stall_p50_s"] == "nan"


def test_a_job_in_flight_that_never_starts_again_stalls_until_it_dies() -> None:
    log = Log().enqueue("a", 0, max_attempts=1).lease("a", 1, 1, 10)
    log.start("a", 1, 20, worker="w9-1").expire("a", 1, 6_000)
    auditor = chaos_audit.Auditor(acknowledged=set()).feed_all(log.records)
    assert auditor.stalls([Fault("worker", 1_000, worker_id="w9-")])["worker"] == [5.0]
