"""Hypothesis properties of the fold over random, mostly plausible interleavings of job events.

A driver turns a list of small integers into a history: most steps are a valid next step for the
job's current state (so histories reach retries, dead jobs and requeues), the rest are garbage:
replayed events, stale or future tokens, wrong attempt numbers, early expiries, conflicting
enqueues and events for a job nobody enqueued. Log time only moves forward, sometimes by a lot.
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass, field, replace
from typing import NamedTuple

from hypothesis import given, settings
from hypothesis import strategies as st

from evsched.adapters.avro import decode_state, encode_state
from evsched.core import bounds, retention
from evsched.core.events import (
    JOB_EVENT_TYPES,
    AttemptCheckpointed,
    AttemptFailed,
    AttemptSnoozed,
    AttemptStarted,
    AttemptSucceeded,
    ChildRegistered,
    Event,
    JobCancelled,
    JobEnqueued,
    JobEvent,
    JobLeased,
    JobPurged,
    JobRequeued,
    LeaseExpired,
    LeaseRenewed,
    Position,
    RetryPolicy,
)
from evsched.core.fold import fold
from evsched.core.invariants import Replay, check_history, replay
from evsched.core.state import JobState, Status, Verdict
from evsched.core.workflow import waits as workflows

T0 = 1_735_689_600_000
JOBS = ("j0", "j1", "j2", "j3")
GHOST = "ghost"  # never enqueued by the plausible driver
PARTITION = {"j0": 0, "j1": 1, "j2": 0, "j3": 1, GHOST: 2}
JUMPS = (0, 0, 1, 7, 250, 1_000, 30_000, 400_000)
# Some enqueues of j3 wait on j0 and j1 (on two partitions): the driver registers it with them
# and sends what their node would when they end (core.workflow.waits), as a node does.
WAITER, PARENTS = "j3", ("j0", "j1")
ARGS = b'{"args":[],"kwargs":{}}'


class Op(NamedTuple):
    """One step of the driver; every choice is drawn independently so garbage combines freely."""

    job: int  # index into JOBS
    mode: int  # 0-5 plausible, 6 replay an earlier event, 7-8 zombie decision, 9 garbage
    variant: int  # which plausible step, zombie decision or garbage kind
    token_delta: int  # garbage token relative to the job's current one
    attempt_delta: int  # garbage lease attempt relative to the expected one
    jump: int  # index into JUMPS: how far log time moves first


OPS = st.lists(
    st.builds(
        Op,
        st.integers(0, len(JOBS) - 1),
        st.integers(0, 9),
        st.integers(0, 9),
        st.integers(-1, 1),
        st.integers(-1, 1),
        st.integers(0, len(JUMPS) - 1),
    ),
    min_size=5,
    max_size=80,
)
History = list[tuple[Event, Position]]


@dataclass
class Driver:
    """Builds a history step by step, folding as it goes to know what a plausible step is."""

    now: int = T0
    history: History = field(default_factory=list)
    live: Replay = field(default_factory=Replay)
    offsets: dict[int, int] = field(default_factory=dict)
    ids: itertools.count[int] = field(default_factory=itertools.count)

    def meta(self, job: str) -> dict[str, str | int]:
        return {"event_id": f"e{next(self.ids)}", "job_id": job, "emitted_at": 0, "source": "d"}

    def step(self, op: Op) -> None:
        self.now += JUMPS[op.jump]
        job = self.pick(op.job)
        state = self.live.jobs.get(job)
        if op.mode < 6:
            event = self.plausible(job, state, op.variant)
        elif op.mode == 6 and self.history:
            event = self.history[(op.variant * 31 + op.jump) % len(self.history)][0]
        elif op.mode < 9 and state is not None:
            event = self.zombie(job, state, op)
        else:
            event = self.garbage(GHOST if op.variant == 9 and op.jump == 0 else job, state, op)
        self.emit(event)

    def pick(self, index: int) -> str:
        """The job at ``index``, or the next one not succeeded yet, so histories keep going deep."""
        for job in JOBS[index:] + JOBS[:index]:
            state = self.live.jobs.get(job)
            if state is None or state.status is not Status.SUCCEEDED:
                return job
        return JOBS[index]

    def zombie(self, job: str, state: JobState, op: Op) -> JobEvent:
        """A node decision from a stale view: a lease or expiry with tokens, attempts, times off."""
        token = state.token + op.token_delta
        if op.variant < 6:
            attempt = state.attempt + 1 + op.attempt_delta
            return JobLeased(**self.meta(job), token=token, attempt=attempt, lease_ms=1_000)
        if op.variant == 9:  # often of a live job, of another run, or too early
            generation = max(0, state.generation + op.token_delta)
            return JobPurged(**self.meta(job), generation=generation)
        if op.variant == 8:  # a registration nobody asked for (maybe of the job itself)
            child = JOBS[(JOBS.index(job) + 2 + op.token_delta) % len(JOBS)]
            return ChildRegistered(**self.meta(job), child_id=child)
        return LeaseExpired(**self.meta(job), token=token)

    def emit(self, event: Event) -> None:
        assert isinstance(event, JobEvent)
        partition = PARTITION.get(event.job_id, 2)
        offset = self.offsets.get(partition, 0)
        self.offsets[partition] = offset + 1
        position = Position(partition=partition, offset=offset, log_at=self.now)
        self.history.append((event, position))
        before = self.live.jobs.get(event.job_id)
        entry = self.live.feed(event, position)
        after = self.live.jobs.get(event.job_id)
        sent = workflows.resolutions_to_send(
            before, after, event, entry.verdict, pos=position, source="node"
        )
        for resolution in sent:  # what the node sends with the record's offset
            self.emit(resolution)
        if isinstance(event, JobEnqueued):  # the client's registrations, in its transaction
            for parent in event.after:
                self.emit(ChildRegistered(**self.meta(parent), child_id=event.job_id))

    def plausible(self, job: str, state: JobState | None, variant: int) -> JobEvent:
        if state is None:
            return self.enqueue(job, variant)
        purge_at = retention.purge_at(state)
        if purge_at is not None and variant >= 8:  # the node purges it once its retention ended
            self.now = max(self.now, purge_at)
            return JobPurged(**self.meta(job), generation=state.generation)
        if state.status is Status.SUCCEEDED:
            # A producer retrying its enqueue: after the key window, a new run of a keyed id.
            return self.enqueue(job, variant)
        if state.status in (Status.DEAD, Status.CANCELLED):
            run_at = None if variant < 5 else self.now + 100 * variant
            return JobRequeued(**self.meta(job), run_at=run_at)
        if variant == 9:
            return JobCancelled(**self.meta(job), reason="driver")
        return self.active(job, state, variant)

    def active(self, job: str, state: JobState, variant: int) -> JobEvent:
        """The next step of a scheduled, leased or running job; time jumps to when it is valid.

        A waiting job has none of its own: one of its parents moves on."""
        if state.status is Status.WAITING:
            resolved = {r.parent_id for r in state.resolutions}
            parent = next(p for p in state.after if p not in resolved)
            return self.plausible(parent, self.live.jobs.get(parent), variant)
        if state.status is Status.SCHEDULED:
            # A node whose clock runs ahead of the log proposes some leases a little early.
            early = {0: 1, 1: 1_000}.get(variant, 0)
            self.now = max(self.now, state.run_at - early)
            attempt = state.attempt + 1
            lease_ms = 500 * (variant + 1)
            return JobLeased(
                **self.meta(job), token=state.token + 1, attempt=attempt, lease_ms=lease_ms
            )
        if state.status is Status.LEASED and variant < 6:
            return AttemptStarted(
                **self.meta(job), token=state.token, worker_id="w", lease_ms=2_000
            )
        if state.status is Status.RUNNING and variant < 8:
            return self.running(job, state, variant)
        assert state.lease_until is not None
        self.now = max(self.now, state.lease_until - (1 if variant == 6 else 0))
        return LeaseExpired(**self.meta(job), token=state.token)

    def running(self, job: str, state: JobState, variant: int) -> JobEvent:
        token = state.token
        if variant < 2:
            return LeaseRenewed(**self.meta(job), token=token, lease_ms=3_000)
        if variant < 4:
            return AttemptCheckpointed(**self.meta(job), token=token, checkpoint=b"%d" % variant)
        if variant < 5:
            return AttemptSucceeded(**self.meta(job), token=token, result=b"ok")
        if variant < 6:  # within the cap of 2 the attempt comes back; past it, a failure
            return AttemptSnoozed(**self.meta(job), token=token, delay_ms=300, max_snoozes=2)
        return AttemptFailed(
            **self.meta(job), token=token, error_type="E", message="m", retryable=variant != 7
        )

    def enqueue(self, job: str, variant: int, args: bytes = b"{}") -> JobEnqueued:
        waits = job == WAITER and 2 <= variant <= 4
        return JobEnqueued(
            **self.meta(job),
            task="t",
            queue="q",
            args=ARGS if waits and args == b"{}" else args,
            after=PARENTS if waits else (),
            after_rule=bounds.AFTER_RULES[variant % 3],
            results_to_args="list" if waits and variant == 3 else "none",
            run_at=None if variant < 5 else self.now + 1_000 * variant,
            max_attempts=1 + variant % 3,
            retry=RetryPolicy(initial_backoff_ms=50 * variant, max_backoff_ms=5_000, jitter=0.5),
            idempotency_key=f"k-{job}" if variant % 2 else None,
            retention_ms=200 * variant,
            key_window_ms=100 * variant,
        )

    def garbage(self, job: str, state: JobState | None, op: Op) -> JobEvent:
        """A kind chosen by ``op.variant`` with a token and an attempt number maybe one off."""
        token = (1 if state is None else state.token) + op.token_delta
        attempt = (0 if state is None else state.attempt) + 1 + op.attempt_delta
        meta = self.meta(job)
        kinds: list[JobEvent] = [
            self.enqueue(job, op.variant, args=b"other" if op.token_delta else b"{}"),
            JobLeased(**meta, token=token, attempt=attempt, lease_ms=1_000),
            AttemptStarted(**meta, token=token, worker_id="zombie", lease_ms=1_000),
            LeaseRenewed(**meta, token=token, lease_ms=10**6),
            AttemptCheckpointed(**meta, token=token, checkpoint=b"zombie"),
            AttemptSucceeded(**meta, token=token, result=b"zombie"),
            AttemptFailed(**meta, token=token, error_type="Z", message="z", retryable=op.jump > 3),
            LeaseExpired(**meta, token=token),  # often too early: no time jump
            JobCancelled(**meta),
            JobRequeued(**meta),
        ]
        return kinds[op.variant]


def build(ops: list[Op]) -> History:
    driver = Driver()
    for op in ops:
        driver.step(op)
    return driver.history


SETTINGS = settings(max_examples=200, deadline=None)


@SETTINGS
@given(OPS)
def test_fold_is_total_and_the_invariants_hold(ops: list[Op]) -> None:
    history = build(ops)
    assert check_history(history) == []


@SETTINGS
@given(OPS)
def test_refused_events_leave_the_state_identical_and_tokens_only_grow(ops: list[Op]) -> None:
    states: dict[str, JobState] = {}
    lease_tokens: dict[str, list[int]] = {}
    for event, position in build(ops):
        assert isinstance(event, JobEvent)
        before = states.get(event.job_id)
        after, entry = fold(before, event, position)
        if entry.verdict is not Verdict.APPLIED:
            assert after is before, entry
            continue
        if after is None:  # purged: the id is forgotten, its tokens may start again
            assert isinstance(event, JobPurged)
            states.pop(event.job_id)
            lease_tokens.pop(event.job_id, None)
            continue
        assert before is None or after.token >= before.token
        if isinstance(event, JobLeased):
            assert before is not None and event.token == before.token + 1  # fold version 8
            assert after.token == event.token
            assert position.log_at >= after.run_at
            lease_tokens.setdefault(event.job_id, []).append(event.token)
        states[event.job_id] = after
    for tokens in lease_tokens.values():
        assert tokens == sorted(set(tokens))


# Leases a forger may send: tokens near the job's own, and anywhere up to the bound and past it.
NEAR = st.lists(st.integers(-2, 3), min_size=1, max_size=4)
ANYWHERE = st.lists(st.integers(0, bounds.MAX_TOKEN + 1), max_size=3)


@SETTINGS
@given(OPS, NEAR, ANYWHERE)
def test_a_lease_applies_only_at_the_token_after_the_current_one(
    ops: list[Op], near: list[int], anywhere: list[int]
) -> None:
    """Every scheduled state the history reaches, offered leases at other tokens: only the
    next token applies, whatever else the lease gets right (fold version 8)."""
    states: dict[str, JobState | None] = {}
    forged_ids = itertools.count()
    for event, position in build(ops):
        assert isinstance(event, JobEvent)
        state, _ = fold(states.get(event.job_id), event, position)
        states[event.job_id] = state
        if state is None or state.status is not Status.SCHEDULED:
            continue
        due = replace(position, log_at=max(position.log_at, state.run_at))
        for token in [state.token + delta for delta in near] + anywhere:
            forged = JobLeased(
                event_id=f"forged-{next(forged_ids)}",
                job_id=state.job_id,
                emitted_at=0,
                source="forger",
                token=token,
                attempt=state.attempt + 1,
                lease_ms=1_000,
            )
            after, entry = fold(state, forged, due)
            assert (entry.verdict is Verdict.APPLIED) == (token == state.token + 1), entry
            if entry.verdict is not Verdict.APPLIED:
                assert after is state


@SETTINGS
@given(OPS)
def test_folding_twice_gives_equal_states_and_identical_bytes(ops: list[Op]) -> None:
    history = build(ops)
    first, second = replay(history), replay(history)
    assert first.jobs == second.jobs
    assert first.job_timelines == second.job_timelines
    for job, state in first.jobs.items():
        assert encode_state(state) == encode_state(second.jobs[job])


@SETTINGS
@given(OPS, st.data())
def test_folding_in_two_halves_through_the_codec_equals_folding_whole(
    ops: list[Op], data: st.DataObject
) -> None:
    history = build(ops)
    cut = data.draw(st.integers(0, len(history)), label="cut")
    whole = replay(history)
    head = replay(history[:cut])
    resumed = Replay(
        jobs={job: decode_state(encode_state(s), JobState) for job, s in head.jobs.items()}
    )
    resumed.feed_all(history[cut:])
    assert resumed.jobs == whole.jobs
    for job, entries in resumed.job_timelines.items():
        assert whole.job_timelines[job][-len(entries) :] == entries
    for job, state in whole.jobs.items():
        assert encode_state(resumed.jobs[job]) == encode_state(state)


def test_the_driver_reaches_every_status_and_verdict() -> None:
    """The driver is only useful if its histories go deep: check what they reach."""
    rng = random.Random(7)
    statuses: set[Status | None] = set()
    verdicts: set[Verdict] = set()
    applied: set[str] = set()
    for _ in range(100):
        ops = [
            Op(
                rng.randrange(3),
                rng.randrange(10),
                rng.randrange(10),
                *rng.choices((-1, 0, 1), k=2),
                rng.randrange(8),
            )
            for _ in range(70)
        ]
        for entries in replay(build(ops)).job_timelines.values():
            statuses |= {e.status_after for e in entries}
            verdicts |= {e.verdict for e in entries}
            applied |= {e.kind for e in entries if e.verdict is Verdict.APPLIED}
    assert statuses == {None, *Status}
    assert verdicts == set(Verdict) - {Verdict.UNDECODABLE}
    assert applied == {kind.__name__ for kind in JOB_EVENT_TYPES}
