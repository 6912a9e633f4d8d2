"""Issue 9 A.1-A.3, B.5: the fold refuses every event a node could not carry out, naming why."""

from __future__ import annotations

import itertools
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from evsched.core import bounds
from evsched.core.events import (
    AttemptCheckpointed,
    AttemptFailed,
    AttemptStarted,
    AttemptSucceeded,
    Event,
    JobCancelled,
    JobEnqueued,
    JobEvent,
    JobLeased,
    JobRequeued,
    JobTemplate,
    LeaseExpired,
    LeaseRenewed,
    Position,
    RetryPolicy,
    ScheduleDeleted,
    ScheduleEvent,
    ScheduleFired,
    ScheduleUpserted,
)
from evsched.core.fold import fold
from evsched.core.schedule import cron
from evsched.core.schedule.fold import fold_schedule
from evsched.core.state import JobState, Status, TimelineEntry, Verdict

T0 = 1_735_689_600_000
AT = Position(partition=0, offset=7, log_at=T0)
HUGE_ID = "j" * 70_000  # the index packed an id's length in 2 bytes
_seq = itertools.count()
DOCS = Path(__file__).resolve().parents[3] / "docs" / "wire-format.md"


def _meta(job_id: str = "j") -> dict[str, Any]:
    return {"event_id": f"e{next(_seq)}", "job_id": job_id, "emitted_at": 0, "source": "t"}


def enqueue(**over: Any) -> JobEnqueued:
    return JobEnqueued(**(_meta() | {"task": "t", "queue": "q", "args": b"{}"} | over))


def template(**over: Any) -> JobTemplate:
    return JobTemplate(**({"task": "t", "queue": "q", "args": b"{}"} | over))


def upsert(**over: Any) -> ScheduleUpserted:
    fields = {
        "event_id": f"e{next(_seq)}",
        "schedule_id": "s",
        "emitted_at": 0,
        "source": "t",
        "cron": "*/5 * * * *",
        "timezone": "UTC",
        "template": template(),
    }
    return ScheduleUpserted(**(fields | over))


def job_events(job_id: str) -> list[JobEvent]:
    m = _meta
    return [
        enqueue(job_id=job_id),
        JobCancelled(**m(job_id)),
        JobRequeued(**m(job_id)),
        JobLeased(**m(job_id), token=1, attempt=1, lease_ms=1_000),
        AttemptStarted(**m(job_id), token=1, worker_id="w", lease_ms=1_000),
        LeaseRenewed(**m(job_id), token=1, lease_ms=1_000),
        AttemptCheckpointed(**m(job_id), token=1, checkpoint=b""),
        AttemptSucceeded(**m(job_id), token=1, result=b""),
        AttemptFailed(**m(job_id), token=1, error_type="E", message="m"),
        LeaseExpired(**m(job_id), token=1),
    ]


def schedule_events(schedule_id: str) -> list[ScheduleEvent]:
    meta = {"event_id": f"e{next(_seq)}", "schedule_id": schedule_id, "emitted_at": 0}
    return [
        upsert(schedule_id=schedule_id),
        ScheduleDeleted(**meta, source="t"),
        ScheduleFired(**meta, source="t", fire_at=T0, job_id="j"),
    ]


def judge(event: Event, state: Any = None) -> tuple[Any, TimelineEntry]:
    if isinstance(event, ScheduleUpserted | ScheduleDeleted | ScheduleFired):
        return fold_schedule(state, event, AT)
    return fold(state, event, AT)


def refused(event: Event, state: Any = None) -> str:
    after, entry = judge(event, state)
    assert entry.verdict is Verdict.REJECTED, entry.reason
    assert after is state
    return entry.reason


@pytest.mark.parametrize("event", job_events(HUGE_ID), ids=lambda e: type(e).__name__)
def test_a_job_id_beyond_the_limit_is_refused_in_every_job_event(event: JobEvent) -> None:
    assert refused(event) == "job_id has 70000 UTF-8 bytes, above the limit of 1024"


@pytest.mark.parametrize("event", schedule_events(HUGE_ID), ids=lambda e: type(e).__name__)
def test_a_schedule_id_beyond_the_limit_is_refused_in_every_schedule_event(
    event: ScheduleEvent,
) -> None:
    assert refused(event) == "schedule_id has 70000 UTF-8 bytes, above the limit of 1024"


@pytest.mark.parametrize(
    "event",
    [*job_events("j"), *schedule_events("s")],
    ids=lambda e: type(e).__name__,
)
def test_an_event_id_beyond_the_limit_is_refused_in_every_kind(event: Event) -> None:
    forged = replace(event, event_id="e" * 1025)  # type: ignore[type-var]
    assert refused(forged) == "event_id has 1025 UTF-8 bytes, above the limit of 1024"


def test_ids_are_measured_in_utf8_bytes_not_characters() -> None:
    assert judge(enqueue(job_id="é" * 512))[1].verdict is Verdict.APPLIED
    assert refused(enqueue(job_id="é" * 513)).startswith("job_id has 1026 UTF-8 bytes")
    assert refused(enqueue(job_id="")) == "job_id must not be empty"
    assert refused(enqueue(job_id="\ud800")) == "job_id is not valid UTF-8"


@pytest.mark.parametrize("queue", ["", "bad queue!", "q" * 201, "dispatch/x", "é"])
def test_a_queue_that_cannot_be_a_topic_name_part_is_refused(queue: str) -> None:
    assert refused(enqueue(queue=queue)).startswith("queue ")
    assert refused(upsert(template=template(queue=queue))).startswith("template.queue ")


def test_the_longest_legal_queue_leaves_room_for_a_namespace_of_the_documented_size() -> None:
    queue = "q" * bounds.MAX_QUEUE_CHARS
    assert judge(enqueue(queue=queue))[1].verdict is Verdict.APPLIED
    topic = f"{'n' * bounds.MAX_NAMESPACE_CHARS}.dispatch.{queue}"
    assert len(topic) == 249  # Kafka's longest topic name
    assert bounds.MAX_NAMESPACE_CHARS == 39


def test_a_refused_enqueue_never_creates_the_job() -> None:
    after, entry = judge(enqueue(queue="bad queue!"))
    assert (after, entry.verdict, entry.status_after) == (None, Verdict.REJECTED, None)


@pytest.mark.parametrize(
    ("event", "reason"),
    [
        (
            JobLeased(**_meta(), token=2**63 - 1, attempt=1, lease_ms=1),
            "token 9223372036854775807 is outside [1, 9007199254740991]",
        ),
        (
            JobLeased(**_meta(), token=1, attempt=1, lease_ms=2**63 - 1),
            "lease_ms 9223372036854775807 is outside [0, 315619200000]",
        ),
        (
            JobLeased(**_meta(), token=1, attempt=2**31, lease_ms=1),
            "attempt 2147483648 is outside [1, 2147483647]",
        ),
        (
            AttemptStarted(**_meta(), token=1, worker_id="w", lease_ms=-1),
            "lease_ms -1 is outside [0, 315619200000]",
        ),
        (
            LeaseRenewed(**_meta(), token=1, lease_ms=2**62),
            "lease_ms 4611686018427387904 is outside [0, 315619200000]",
        ),
        (LeaseExpired(**_meta(), token=-1), "token -1 is outside [0, 9007199254740991]"),
        (
            JobRequeued(**_meta(), run_at=2**63 - 1),
            "run_at 9223372036854775807 is outside [0, 253402300799999]",
        ),
        (enqueue(run_at=-5), "run_at -5 is outside [0, 253402300799999]"),
        (enqueue(fire_at=2**62), "fire_at 4611686018427387904 is outside [0, 253402300799999]"),
        (enqueue(timeout_ms=0), "timeout_ms 0 is outside [1, 315619200000]"),
        (enqueue(priority=-(2**63)), "priority -9223372036854775808 is outside"),
        (enqueue(task=""), "task must not be empty"),
        (enqueue(task="t" * 2049), "task has 2049 UTF-8 bytes, above the limit of 2048"),
        (enqueue(idempotency_key="k" * 2049), "idempotency_key has 2049 UTF-8 bytes"),
        (enqueue(schedule_id="s" * 1025), "schedule_id has 1025 UTF-8 bytes"),
        (enqueue(labels={str(i): "" for i in range(65)}), "labels has 65 entries"),
        (enqueue(labels={"": "v"}), "labels key must not be empty"),
        (enqueue(labels={"k": "v" * 2049}), "labels['k'] has 2049 UTF-8 bytes"),
    ],
    ids=lambda v: v if isinstance(v, str) else type(v).__name__,
)
def test_numbers_and_names_out_of_range_are_refused(event: JobEvent, reason: str) -> None:
    assert refused(event).startswith(reason)


@pytest.mark.parametrize(
    ("policy", "reason"),
    [
        (RetryPolicy(initial_backoff_ms=-1), "retry.initial_backoff_ms -1 is outside"),
        (RetryPolicy(max_backoff_ms=2**63 - 1), "retry.max_backoff_ms 9223372036854775807"),
        (RetryPolicy(multiplier=float("inf")), "retry.multiplier inf is outside [1, 1000]"),
        (RetryPolicy(multiplier=0.5), "retry.multiplier 0.5 is outside [1, 1000]"),
        (RetryPolicy(jitter=float("nan")), "retry.jitter nan is outside [0, 1]"),
        (RetryPolicy(jitter=1.5), "retry.jitter 1.5 is outside [0, 1]"),
    ],
)
def test_retry_policies_out_of_range_are_refused(policy: RetryPolicy, reason: str) -> None:
    assert refused(enqueue(retry=policy)).startswith(reason)
    assert refused(upsert(template=template(retry=policy))).startswith(f"template.{reason}")


def test_schedule_template_limits_name_the_template_field() -> None:
    assert refused(upsert(template=template(max_attempts=0))) == (
        "template.max_attempts 0 is outside [1, 2147483647]"
    )
    assert refused(upsert(cron="* " * 200)).startswith("cron has 400 UTF-8 bytes")
    assert refused(upsert(timezone="Z" * 65)).startswith("timezone has 65 UTF-8 bytes")
    fire = ScheduleFired(
        event_id="f", schedule_id="s", emitted_at=0, source="t", fire_at=-1, job_id="j"
    )
    assert refused(fire) == "fire_at -1 is outside [0, 253402300799999]"
    assert refused(replace(fire, fire_at=T0, job_id="")) == "job_id must not be empty"


def test_limits_at_their_bounds_are_applied() -> None:
    state, entry = judge(
        enqueue(
            run_at=bounds.MAX_TIME_MS,
            timeout_ms=bounds.MAX_DURATION_MS,
            max_attempts=bounds.MAX_ATTEMPTS,
            priority=bounds.MAX_PRIORITY,
            retry=RetryPolicy(
                initial_backoff_ms=bounds.MAX_DURATION_MS,
                max_backoff_ms=bounds.MAX_DURATION_MS,
                multiplier=bounds.MAX_MULTIPLIER,
                jitter=1.0,
            ),
            labels={"k" * 256: "v" * 2048},
        )
    )
    assert entry.verdict is Verdict.APPLIED, entry.reason
    assert isinstance(state, JobState)
    # Leases go one token at a time (fold version 8): the job's last lease was the one before.
    state = replace(state, token=bounds.MAX_TOKEN - 1)
    lease = JobLeased(**_meta(), token=bounds.MAX_TOKEN, attempt=1, lease_ms=bounds.MAX_DURATION_MS)
    leased, entry = fold(state, lease, replace(AT, log_at=bounds.MAX_TIME_MS))
    assert entry.verdict is Verdict.APPLIED, entry.reason
    assert leased is not None and leased.lease_until is not None
    assert leased.lease_until < 2**63 and leased.token + 1 < 2**63


@pytest.mark.parametrize(
    "expression",
    ["R * * * *", "r(0-29) * * * *", "0 R * * *", "* * * * R", "H/5 * * * *", "0 0 * * * * R"],
)
def test_cron_with_a_random_or_hashed_field_is_refused(expression: str) -> None:
    """Issue 9 B.5: replicas would each draw their own R and compute different slots."""
    reason = refused(upsert(cron=expression))
    assert re.fullmatch(
        r"cron field '[HhRr].*' is random or hashed; give the values explicitly", reason
    )
    with pytest.raises(cron.InvalidSchedule, match="random or hashed"):
        cron.validate(expression, "UTC")


def test_cron_with_explicit_values_and_names_is_still_accepted() -> None:
    for expression in ("0 3 * MAR-APR FRI", "@hourly", "*/15 * * * *"):
        _, entry = judge(upsert(cron=expression))
        assert entry.verdict is Verdict.APPLIED, entry.reason


def test_the_documented_limits_are_the_enforced_ones() -> None:
    text = DOCS.read_text()
    for name in (
        "MAX_ID_BYTES",
        "MAX_IDEMPOTENCY_KEY_BYTES",
        "MAX_TASK_BYTES",
        "MAX_QUEUE_CHARS",
        "MAX_NAMESPACE_CHARS",
        "MAX_LABELS",
        "MAX_LABEL_KEY_BYTES",
        "MAX_LABEL_VALUE_BYTES",
        "MAX_CRON_BYTES",
        "MAX_TIMEZONE_BYTES",
        "MAX_TIME_MS",
        "MAX_DURATION_MS",
        "MAX_TOKEN",
        "MAX_ATTEMPTS",
        "MAX_PRIORITY",
    ):
        value = getattr(bounds, name)
        assert f"`{name}` | {value:,}" in text, name


def test_a_leased_status_survives_a_refused_event() -> None:
    state, _ = judge(enqueue())
    leased, _ = fold(state, JobLeased(**_meta(), token=1, attempt=1, lease_ms=5), AT)
    assert leased is not None and leased.status is Status.LEASED
    assert refused(LeaseExpired(**_meta(), token=2**60), leased).startswith("token")


def test_values_of_the_wrong_type_are_refused_not_raised() -> None:
    assert bounds.id_refusal("job_id", 5) == "job_id must be a string"  # type: ignore[arg-type]
    assert bounds.queue_refusal(None) == "queue None must be non-empty and only [A-Za-z0-9._-]"  # type: ignore[arg-type]
    assert refused(enqueue(retry=RetryPolicy(jitter="x"))).startswith("retry.jitter 'x'")  # type: ignore[arg-type]
    assert refused(enqueue(priority=True)).startswith("priority True is outside")
