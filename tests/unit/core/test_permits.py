"""The fold rules of global limits (core.permits): limits set, permits requested, granted and
released at a limit's home, asks and grants on the job's partition, the lease guard, and the
planning of requests and grants; hostile steps are refused with a reason."""

from __future__ import annotations

from dataclasses import replace

from evsched.core import permits
from evsched.core.events import (
    AttemptSucceeded,
    JobCancelled,
    JobLeased,
    KeyLimitSet,
    PermitGranted,
    PermitRequested,
    Position,
    QueueLimitSet,
    QueuePermit,
    RetryPolicy,
)
from evsched.core.permits import Ask, LimitState, Waiter
from evsched.core.state import JobState, Status, TimelineEntry, Verdict


def at(offset: int, log_at: int = 1_000, partition: int = 0) -> Position:
    return Position(partition=partition, offset=offset, log_at=log_at)


def job(job_id: str = "j", status: Status = Status.SCHEDULED, **labels: str) -> JobState:
    return JobState(
        job_id=job_id, status=status, task="t", queue="q", args=b"[]", priority=0, run_at=0,
        max_attempts=3, retry=RetryPolicy(), timeout_ms=1_000, enqueued_at=0, updated_at=5,
        partition=0, labels=dict(labels),
    )  # fmt: skip


def limit_set(
    n: int | None = 2, *, rate: tuple[int, int] | None = None, eid: str = "l"
) -> QueueLimitSet:
    starts, per = rate or (None, None)
    return QueueLimitSet(
        event_id=eid, queue="q", emitted_at=0, source="cli", max_running=n, rate_starts=starts,
        rate_per_ms=per, reason="why",
    )  # fmt: skip


def step(
    action: str, job_id: str = "j", eid: str | None = None, key: str | None = None
) -> QueuePermit:
    return QueuePermit(
        event_id=eid or f"{action}-{job_id}", queue="q", job_id=job_id, action=action,
        emitted_at=0, source="node-1", key=key,
    )  # fmt: skip


def home(n: int | None = 2, **kw: object) -> LimitState:
    state, entry, _ = permits.fold_limit(None, limit_set(n), at(0))
    assert state is not None and entry.verdict is Verdict.APPLIED
    return replace(state, **kw)  # type: ignore[arg-type]


def test_a_limit_set_applies_and_reads_its_values() -> None:
    state, entry, forward = permits.fold_limit(None, limit_set(2, rate=(5, 1_000)), at(0))
    assert state is not None and state.max_running == 2 and state.rate_starts == 5
    assert entry.reason == (
        "queue q limited to at most 2 running and at most 5 starts per 1000 ms by cli: why"
    )
    assert forward is None
    removed, entry, _ = permits.fold_limit(state, limit_set(None, eid="l2"), at(1))
    assert removed is not None and not removed.limited
    assert entry.reason == "queue q no longer limited by cli: why"
    again, entry, _ = permits.fold_limit(removed, limit_set(None, eid="l2"), at(2))
    assert entry.verdict is Verdict.DUPLICATE and again is removed


def test_a_key_limit_is_named_by_its_key() -> None:
    event = KeyLimitSet(event_id="k", key="cust-1", emitted_at=0, source="cli", max_running=1)
    state, entry, _ = permits.fold_limit(None, event, at(0))
    assert state is not None and state.name == "key:cust-1"
    assert entry.reason == "key cust-1 limited to at most 1 running by cli"
    assert permits.limit_name(event) == "key:cust-1"


def test_hostile_limits_are_refused_with_the_field() -> None:
    bad = [
        (limit_set(0), "max_running 0 is outside"),
        (replace(limit_set(), rate_starts=3), "rate_starts and rate_per_ms go together"),
        (limit_set(None, rate=(0, 10)), "rate_starts 0 is outside"),
        (replace(limit_set(None), queue="bad queue!"), "queue 'bad queue!' must be"),
        (KeyLimitSet(event_id="k", key="", emitted_at=0, source="x"), "key must not be empty"),
        (KeyLimitSet(event_id="k", key="k" * 201, emitted_at=0, source="x"), "key has 201"),
    ]
    for event, reason in bad:
        state, entry, _ = permits.fold_limit(None, event, at(0))
        assert state is None and entry.verdict is Verdict.REJECTED
        assert entry.reason.startswith(reason), entry.reason


def test_the_home_keeps_requests_grants_within_the_limit_and_takes_releases() -> None:
    state: LimitState | None = home(1)
    for i, event in enumerate([step("request", "a"), step("request", "b")], start=1):
        state, entry, _ = permits.fold_limit(state, event, at(i))
        assert entry.verdict is Verdict.APPLIED
    state, entry, forward = permits.fold_limit(state, step("grant", "a"), at(3))
    assert entry.reason == "permit 1 of 1 granted to job a"
    assert isinstance(forward, PermitGranted) and forward.job_id == "a" and forward.queue == "q"
    assert state is not None and state.holders == ("a",)
    state, entry, forward = permits.fold_limit(state, step("grant", "b"), at(4))
    assert entry.verdict is Verdict.REJECTED and forward is None
    assert entry.reason == "grant beyond the limit: 1 of 1 permits of queue q held"
    state, entry, _ = permits.fold_limit(state, step("request", "a", "again"), at(5))
    assert entry.reason == "job a already holds a permit"
    state, entry, _ = permits.fold_limit(state, step("request", "b", "again-b"), at(5))
    assert entry.reason == "job b already waits for a permit"
    state, entry, _ = permits.fold_limit(state, step("release", "a"), at(6))
    assert entry.reason == "job a released its permit"
    state, entry, _ = permits.fold_limit(state, step("release", "a", "twice"), at(7))
    assert entry.verdict is Verdict.REJECTED
    assert entry.reason == "release for job a, which holds no permit and waits for none"
    state, entry, _ = permits.fold_limit(state, step("release", "b"), at(8))
    assert entry.reason == "job b withdrew its request"
    state, entry, _ = permits.fold_limit(state, step("grant", "nobody"), at(9))
    assert entry.reason == "grant for job nobody, which waits for no permit"
    state, entry, _ = permits.fold_limit(state, step("steal"), at(10))
    assert entry.reason.startswith("action 'steal' is not one of")


def test_a_rate_limits_grants_per_window_of_log_time() -> None:
    state, _, _ = permits.fold_limit(None, limit_set(None, rate=(2, 1_000)), at(0, 0))
    for i, name in enumerate("abc", start=1):
        state, _, _ = permits.fold_limit(state, step("request", name), at(i, 0))
    state, first, _ = permits.fold_limit(state, step("grant", "a"), at(4, 100))
    state, second, _ = permits.fold_limit(state, step("grant", "b"), at(5, 200))
    assert first.verdict is second.verdict is Verdict.APPLIED
    assert first.reason == "permit 1 granted to job a"
    state, third, _ = permits.fold_limit(state, step("grant", "c"), at(6, 1_099))
    assert third.verdict is Verdict.REJECTED
    assert third.reason == "grant beyond the rate: 2 of 2 permits granted in the last 1000 ms"
    assert state is not None and permits.next_grant_at(state, 1_099) == 100 + 1_000 + 101
    state, fourth, _ = permits.fold_limit(state, step("grant", "c", "g2"), at(7, 1_100))
    assert fourth.verdict is Verdict.APPLIED
    assert state is not None and state.granted_at == (200, 1_100)


def test_the_job_partition_asks_once_takes_its_grant_and_refuses_others() -> None:
    limit = home(2)
    ask = PermitRequested(event_id="ask", job_id="j", emitted_at=0, source="n", queue="q")
    state, entry, forward = permits.fold_permit(limit, job(), ask, at(1))
    assert entry.verdict is Verdict.APPLIED and entry.status_after is Status.SCHEDULED
    assert isinstance(forward, QueuePermit) and forward.action == "request" and forward.key is None
    assert state is not None and state.asked == (Ask(job_id="j", granted=False),)
    again = replace(ask, event_id="ask2")
    _, entry, _ = permits.fold_permit(state, job(), again, at(2))
    assert entry.reason == "job asked for a permit already"
    grant = PermitGranted(event_id="g", job_id="j", emitted_at=0, source="n", queue="q")
    state, entry, _ = permits.fold_permit(state, job(), grant, at(3))
    assert entry.reason == "permit of queue q granted"
    assert state is not None and permits.may_lease({"q": state}, job())
    _, entry, _ = permits.fold_permit(state, job(), replace(grant, event_id="g2"), at(4))
    assert entry.reason == "grant rejected: job holds a permit already"
    _, entry, _ = permits.fold_permit(state, job(), grant, at(5))
    assert entry.verdict is Verdict.DUPLICATE


def test_hostile_asks_and_grants_on_the_job_partition_are_refused() -> None:
    limit = home(2)
    ask = PermitRequested(event_id="ask", job_id="j", emitted_at=0, source="n", queue="q")
    grant = PermitGranted(event_id="g", job_id="j", emitted_at=0, source="n", queue="q")
    cases = [
        (limit, None, ask, "unknown job"),
        (limit, job(), replace(ask, queue="other"), "no queue other limit holds for this job"),
        (None, job(), ask, "queue q has no limit"),
        (limit, job(status=Status.RUNNING), ask, "cannot ask for a permit: job is running"),
        (limit, job(), grant, "grant rejected: job did not ask for a permit"),
        (limit, None, grant, "unknown job"),
        (limit, job(), replace(ask, key=""), "key must not be empty"),
    ]
    for state, the_job, event, reason in cases:
        after, entry, forward = permits.fold_permit(state, the_job, event, at(1))
        assert entry.verdict is Verdict.REJECTED and entry.reason == reason
        assert after is state
        if isinstance(event, PermitGranted):  # a grant nobody asked for goes back at once
            assert isinstance(forward, QueuePermit) and forward.action == "release"
        else:
            assert forward is None
    keyed = replace(grant, key="k")
    _, _, forward = permits.fold_permit(None, None, keyed, at(2))
    assert isinstance(forward, QueuePermit) and forward.key == "k" and forward.queue == "q"
    held = replace(limit, asked=(Ask(job_id="j", granted=True),))
    _, entry, forward = permits.fold_permit(held, job(), replace(grant, event_id="g9"), at(3))
    assert entry.verdict is Verdict.REJECTED and forward is None  # its permit stays held


def _entry(kind: str, verdict: Verdict = Verdict.APPLIED) -> TimelineEntry:
    return TimelineEntry(
        partition=0, offset=9, log_at=50, kind=kind, event_id="e", source="node-1",
        verdict=verdict, reason="ok",
    )  # fmt: skip


def test_a_lease_needs_a_granted_permit() -> None:
    lease = JobLeased(
        event_id="l", job_id="j", emitted_at=0, source="n", token=1, attempt=1, lease_ms=1
    )
    leased = job(status=Status.LEASED)
    limit = home(1, asked=(Ask(job_id="j", granted=False),))
    after, entry, state, forward = permits.guard_job(
        limit, job(), leased, lease, _entry("JobLeased")
    )
    assert entry.verdict is Verdict.REJECTED and after == job() and forward is None
    assert entry.reason == "cannot lease: queue q is limited and the job holds no permit"
    granted = replace(limit, asked=(Ask(job_id="j", granted=True),))
    after, entry, state, _ = permits.guard_job(granted, job(), leased, lease, _entry("JobLeased"))
    assert entry.verdict is Verdict.APPLIED and after is leased and state is granted
    refused = _entry("JobLeased", Verdict.REJECTED)
    assert permits.guard_job(limit, job(), leased, lease, refused)[1] is refused
    assert permits.guard_job(limit, None, leased, lease, _entry("JobLeased"))[0] is leased


def test_a_job_that_ends_or_goes_back_to_waiting_releases_its_permit() -> None:
    limit = home(1, asked=(Ask(job_id="j", granted=True), Ask(job_id="k", granted=False)))
    done = AttemptSucceeded(
        event_id="s", job_id="j", emitted_at=0, source="w", token=1, result=b"null"
    )
    running = job(status=Status.RUNNING)
    for after in (job(status=Status.SUCCEEDED), job(), None):
        _, _, state, forward = permits.guard_job(limit, running, after, done, _entry("X"))
        assert isinstance(forward, QueuePermit) and forward.action == "release"
        assert state.asked == (Ask(job_id="k", granted=False),)
    cancel = JobCancelled(event_id="c", job_id="j", emitted_at=0, source="cli")
    # A scheduled job that stays scheduled keeps its ask; one cancelled gives it back.
    assert permits.guard_job(limit, job(), job(), cancel, _entry("X"))[3] is None
    cancelled = job(status=Status.CANCELLED)
    assert permits.guard_job(limit, job(), cancelled, cancel, _entry("X"))[3] is not None
    unasked = home(1)
    assert permits.guard_job(unasked, running, None, done, _entry("X"))[3] is None


def test_a_concurrency_key_adds_a_limit_and_its_permit() -> None:
    keyed = job(**{permits.KEY_LABEL: "cust-1"})
    assert permits.limit_names(keyed) == ("key:cust-1", "q")
    assert permits.limit_names(job(**{permits.KEY_LABEL: "x" * 201})) == ("q",)
    assert permits.limit_names(job(**{permits.KEY_LABEL: ""})) == ("q",)
    key_limit, _, _ = permits.fold_limit(
        None, KeyLimitSet(event_id="k", key="cust-1", emitted_at=0, source="c", max_running=1),
        at(0),
    )  # fmt: skip
    assert key_limit is not None
    states = {"key:cust-1": key_limit}
    asks = permits.plan_requests(
        [keyed], states, now=5, source="n", order=lambda s: (0, 0, s.job_id)
    )
    assert [(a.queue, a.key) for a in asks] == [("q", "cust-1")]
    ask = asks[0]
    state, _, forward = permits.fold_permit(key_limit, keyed, ask, at(1))
    assert isinstance(forward, QueuePermit) and forward.key == "cust-1"
    assert state is not None
    assert not permits.may_lease({"key:cust-1": state}, keyed)
    assert permits.waiting_for_grant({"key:cust-1": state}, keyed)
    assert not permits.waiting_for_grant({}, keyed)
    assert permits.may_lease({"q": home(None)}, job())


def test_requests_are_planned_best_first_within_the_room() -> None:
    limit = home(2, asked=(Ask(job_id="x", granted=True),))
    jobs = [replace(job(f"j{i}"), priority=i) for i in range(3)]
    asks = permits.plan_requests(
        jobs, {"q": limit}, now=5, source="n", order=lambda s: (-s.priority, 0, s.job_id)
    )
    assert [a.job_id for a in asks] == ["j2"]  # one more ask fits next to x
    rate_only = replace(limit, max_running=None, rate_starts=3, rate_per_ms=10)
    assert len(permits.plan_requests(jobs, {"q": rate_only}, now=5, source="n",
                                     order=lambda s: (0, 0, s.job_id))) == 2  # fmt: skip
    unlimited = replace(limit, max_running=None)
    assert permits.plan_requests(jobs, {"q": unlimited}, now=5, source="n",
                                 order=lambda s: (0, 0, s.job_id)) == []  # fmt: skip


def test_grants_are_planned_by_priority_then_arrival_within_the_room() -> None:
    waiting = (
        Waiter(job_id="late", queue="q", priority=0, offset=5),
        Waiter(job_id="early", queue="q", priority=0, offset=2),
        Waiter(job_id="urgent", queue="q", priority=9, offset=9),
    )
    state = home(2, waiting=waiting)
    grants = permits.plan_grants(state, pending=lambda j: False, now=0, source="n")
    assert [g.job_id for g in grants] == ["urgent", "early"]
    grants = permits.plan_grants(state, pending=lambda j: j == "urgent", now=0, source="n")
    assert [g.job_id for g in grants] == ["early"]  # the one in flight counts
    full = replace(state, holders=("a", "b"))
    assert permits.plan_grants(full, pending=lambda j: False, now=0, source="n") == []
    free = replace(state, max_running=None)
    assert len(permits.plan_grants(free, pending=lambda j: False, now=0, source="n")) == 3
    rated = replace(free, rate_starts=1, rate_per_ms=1_000, granted_at=(500,))
    assert permits.plan_grants(rated, pending=lambda j: False, now=1_000, source="n") == []
    assert permits.next_grant_at(rated, 1_000) == 500 + 1_000 + 101
    assert permits.next_grant_at(free, 1_000) is None
    assert permits.next_grant_at(replace(rated, granted_at=()), 1_000) is None
    keyed = replace(state, name="key:k")
    [grant, _] = permits.plan_grants(keyed, pending=lambda j: False, now=0, source="n")
    assert grant.key == "k" and grant.queue == "q"


def test_limit_events_are_keyed_by_their_limit_s_name() -> None:
    from evsched.core.events import entity_id

    key_limit = KeyLimitSet(event_id="k", key="cust-1", emitted_at=0, source="c")
    assert entity_id(key_limit) == "key:cust-1"
    assert entity_id(limit_set()) == "q"
    assert entity_id(step("grant")) == "q"
    assert entity_id(step("grant", key="cust-1")) == "key:cust-1"
    ask = PermitRequested(event_id="a", job_id="j", emitted_at=0, source="n", queue="q", key="k")
    assert entity_id(ask) == "j"


def test_the_lateness_of_a_start_splits_into_the_wait_for_a_permit_and_the_rest() -> None:
    from evsched.core.state import FoldedEvent
    from evsched.metrics import Metrics

    metrics = Metrics(job_counts=False)
    queued = replace(job(), run_at=1_000)
    grant = replace(_entry("PermitGranted"), log_at=4_000)
    start = replace(_entry("AttemptStarted"), log_at=4_500)
    running = replace(queued, status=Status.RUNNING)
    metrics.observe_commit(
        [FoldedEvent(grant, queued, queued), FoldedEvent(start, queued, running)]
    )
    plain = replace(job("p"), run_at=1_000)
    metrics.observe_commit([FoldedEvent(start, plain, replace(plain, status=Status.RUNNING))])
    sums = {
        (s.labels["cause"], s.name): s.value
        for family in metrics.registry.collect()
        if family.name == "evsched_start_lateness_by_cause_seconds"
        for s in family.samples
        if s.name.endswith(("_sum", "_count"))
    }
    suffix = "evsched_start_lateness_by_cause_seconds"
    assert sums[("limit", f"{suffix}_sum")] == 3.0
    assert sums[("limit", f"{suffix}_count")] == 1
    assert sums[("late", f"{suffix}_sum")] == 0.5 + 3.5
    assert sums[("late", f"{suffix}_count")] == 2


def test_a_grant_whose_job_ends_without_starting_is_forgotten() -> None:
    # An API runs for months: a granted job that is cancelled (or dead-lettered) before it
    # starts must not leave its grant's time behind for ever.
    from evsched.core.state import FoldedEvent
    from evsched.metrics import Metrics

    metrics = Metrics(job_counts=False)
    queued = replace(job(), run_at=1_000)
    grant = replace(_entry("PermitGranted"), log_at=4_000)
    cancel = replace(_entry("JobCancelled"), log_at=4_200)
    metrics.observe_commit(
        [
            FoldedEvent(grant, queued, queued),
            FoldedEvent(cancel, queued, replace(queued, status=Status.CANCELLED)),
        ]
    )
    assert metrics._granted_at == {}


def test_a_job_asks_for_its_key_s_permit_before_its_queue_s() -> None:
    keyed = job(**{permits.KEY_LABEL: "k"})
    queue_limit = home(1)
    key_limit = replace(home(1), name="key:k")
    states = {"q": queue_limit, "key:k": key_limit}

    def plan(states: dict[str, LimitState]) -> list[str | None]:
        asks = permits.plan_requests(
            [keyed], states, now=1, source="n", order=lambda s: (0, 0, s.job_id)
        )
        return [a.key for a in asks]

    assert plan(states) == ["k"]
    waiting = replace(key_limit, asked=(Ask(job_id="j", granted=False),))
    assert plan({**states, "key:k": waiting}) == []  # waits for the key's grant first
    granted = replace(key_limit, asked=(Ask(job_id="j", granted=True),))
    assert plan({**states, "key:k": granted}) == [None]  # then asks for the queue's
    both = {"key:k": granted, "q": replace(queue_limit, asked=(Ask(job_id="j", granted=True),))}
    assert plan(both) == []
    assert plan({"key:k": replace(key_limit, max_running=None), "q": queue_limit}) == [None]


def test_the_replay_folds_limits_per_partition_like_a_node() -> None:
    from evsched.core.events import JobEnqueued
    from evsched.core.invariants import replay

    enq = JobEnqueued(
        event_id="e", job_id="j", emitted_at=0, source="c", task="t", queue="q", args=b"[]",
        max_attempts=3, retry=RetryPolicy(), timeout_ms=1_000,
    )  # fmt: skip
    ask = PermitRequested(event_id="a", job_id="j", emitted_at=0, source="n", queue="q")
    lease = JobLeased(
        event_id="l", job_id="j", emitted_at=0, source="n", token=1, attempt=1, lease_ms=9_000
    )
    grant_elsewhere = PermitGranted(event_id="g0", job_id="x", emitted_at=0, source="n", queue="q")
    grant = PermitGranted(event_id="g", job_id="j", emitted_at=0, source="n", queue="q")
    done = replay(
        [
            (step("grant", "x", "no-limit-here"), at(0, 10, partition=1)),  # no state: refused
            (grant_elsewhere, at(1, 10, partition=1)),
            (limit_set(1), at(0, 10)),
            (enq, at(1, 10)),
            (replace(lease, event_id="early"), at(2, 20)),  # no permit yet: refused
            (ask, at(3, 20)),
            (step("request"), at(4, 20)),
            (step("grant"), at(5, 20)),
            (grant, at(6, 20)),
            (lease, at(7, 30)),
        ]
    )
    verdicts = [(e.kind, e.verdict.value) for e in done.job_timelines["j"]]
    assert verdicts == [
        ("JobEnqueued", "applied"),
        ("JobLeased", "rejected"),
        ("PermitRequested", "applied"),
        ("PermitGranted", "applied"),
        ("JobLeased", "applied"),
    ]
    assert done.limit_verdicts[1, 0] is Verdict.REJECTED
    assert (1, "q") not in done.limits
    assert done.limits[0, "q"].holders == ("j",)
