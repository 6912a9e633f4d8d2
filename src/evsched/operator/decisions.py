"""Planner replay: the node's decisions in a recorded history re-planned and compared.

Walking a history in log order, each decision a node wrote and the fold applied (a lease, an
expiry, a purge, a cron fire) is planned again by the current planner (``core.planner``) from the
state folded so far, with the clock the node had: the decision's ``emitted_at``. A step's leases
(one node, one clock reading, one partition) are also checked against the planner's order: in
``due_order``, and no job of a leased queue that the planner puts ahead of them passed over. What a
recording cannot say exactly is tolerated by a declared model (``DecisionModel``); see
``docs/operator.md`` ("Planner replay") and ``replay/README.md``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, fields
from typing import Any, TypeAlias

from evsched.adapters.archive.history_file import LoggedEvent
from evsched.adapters.proofs import NodeKeyring
from evsched.core import planner
from evsched.core.controls import QUEUE
from evsched.core.events import (
    Event,
    EventFamily,
    JobLeased,
    JobPurged,
    LeaseExpired,
    PermitGranted,
    PermitRequested,
    Position,
    QueuePermit,
    ScheduleFired,
)
from evsched.core.invariants import Replay
from evsched.core.permits import limit_name, limit_names
from evsched.core.state import JobState, Status, Verdict
from evsched.operator.replay import positioned

LEASE = "lease"
EXPIRY = "expiry"
PURGE = "purge"
FIRE = "fire"
ORDER = "lease order"
PERMIT = "permit"
KINDS = (LEASE, ORDER, EXPIRY, PURGE, FIRE)
NODE_PREFIX = "node-"
# The decisions judged here; a node's permit steps are counted only (``DecisionDiff.unjudged``).
Decision: TypeAlias = JobLeased | LeaseExpired | JobPurged | ScheduleFired
# How long before a step's clock a record may have been appended and still not been folded by the
# node that decided: the node plans from what its last poll returned.
DEFAULT_LAG_MS = 1_000


@dataclass(frozen=True, slots=True, kw_only=True)
class DecisionModel:
    """What the recording's nodes were configured with, and the tolerance for what they knew.

    ``budgets``: the nodes' planner budgets (``dispatch_timeout_ms`` and ``prelease_ms`` shape a
    lease; the per-queue limits are not judged, see ``docs/operator.md``). ``lag_ms``: a job whose
    last event was appended less than this long before a step may be unknown to the node then.
    """

    budgets: planner.PlannerBudgets = field(default_factory=planner.PlannerBudgets)
    lag_ms: int = DEFAULT_LAG_MS


@dataclass(frozen=True, slots=True, kw_only=True)
class Divergence:
    """The first decision of a kind the current planner would not have made as recorded."""

    kind: str
    entity: str
    partition: int
    offset: int
    recorded: str
    planned: str
    why: str

    def describe(self) -> str:
        return (
            f"{self.kind}: {self.entity} at p{self.partition}@{self.offset}: recorded "
            f"{self.recorded}, planner: {self.planned} ({self.why})"
        )

    def as_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "entity": self.entity,
            "partition": self.partition,
            "offset": self.offset,
            "recorded": self.recorded,
            "planned": self.planned,
            "why": self.why,
        }


@dataclass(slots=True)
class DecisionDiff:
    """Per decision kind: how many were judged, the first divergence and how many diverged."""

    judged: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    first: dict[str, Divergence] = field(default_factory=dict)
    diverged: dict[str, int] = field(default_factory=dict)
    # Node decisions the fold refused (a race or a zombie: the fold judged them) and permit steps
    # (planned by the node's runtime from other partitions' state: not judged here).
    refused: int = 0
    unjudged: int = 0
    events: int = 0

    @property
    def identical(self) -> bool:
        return not self.first

    def note(self, kind: str, divergence: Divergence | None) -> None:
        self.judged[kind] += 1
        if divergence is None:
            return
        self.diverged[kind] = self.diverged.get(kind, 0) + 1
        self.first.setdefault(kind, divergence)

    def firsts(self) -> list[Divergence]:
        """The first divergence of each kind, in log order."""
        return sorted(self.first.values(), key=lambda d: (d.partition, d.offset, d.kind))


@dataclass(slots=True)
class _Step:
    """The leases one node wrote on one partition with one clock reading."""

    partition: int
    source: str
    now: int
    leases: list[tuple[JobState, JobLeased, int]] = field(default_factory=list)
    # The jobs the planner could have leased at the step, as folded before its first lease.
    eligible: list[JobState] = field(default_factory=list)


def diff_history(
    events: Iterable[LoggedEvent],
    model: DecisionModel,
    *,
    keyring: NodeKeyring | None = None,
    judge_from: int = 0,
) -> DecisionDiff:
    """Replay ``events`` (any order; walked by partition and offset) and judge its decisions;
    those below offset ``judge_from`` are only folded (the state a range's steps plan from)."""
    walk = _Walk(model, judge_from)
    skipped: list[LoggedEvent] = []
    for _logged, event, position in positioned(events, keyring, skipped=skipped):
        walk.diff.events += 1
        walk.feed(event, position)
    walk.diff.events += len(skipped)
    walk.close_step()
    return walk.diff


class _Walk:
    """The fold of a history so far, the decisions judged against it, the open lease step."""

    def __init__(self, model: DecisionModel, judge_from: int = 0) -> None:
        self.model = model
        self.judge_from = judge_from
        self.replay = Replay()
        self.diff = DecisionDiff()
        self.step: _Step | None = None
        # The queues and keys some limit governs: their jobs wait for permits, not for the order.
        self.limited: set[str] = set()
        # The scheduled jobs by partition: what a step's lease order is checked against.
        self.scheduled: dict[int, set[str]] = {}

    def feed(self, event: Event, position: Position) -> None:
        partition, offset = position.partition, position.offset
        node = event.source.startswith(NODE_PREFIX) and offset >= self.judge_from
        before = _state_of(self.replay, event)
        if isinstance(event, JobLeased) and node:
            self._step_for(partition, event)
        entry = self.replay.feed(event, position)
        if event.family is EventFamily.LIMIT:
            self.limited.add(_limit_of(event))
        elif event.family is EventFamily.JOB or event.family is EventFamily.PERMIT:
            self._track(partition, event.job_id)
        if node and isinstance(event, PermitRequested | PermitGranted | QueuePermit):
            self.diff.unjudged += 1
        if not node or not isinstance(event, JobLeased | LeaseExpired | JobPurged | ScheduleFired):
            return
        if entry.verdict is not Verdict.APPLIED or before is None:
            self.diff.refused += 1
            return
        kind, divergence = _judge(event, before, self.model, partition, offset)
        self.diff.note(kind, divergence)
        if isinstance(event, JobLeased) and isinstance(before, JobState) and self.step:
            self.step.leases.append((before, event, offset))

    def _step_for(self, partition: int, event: JobLeased) -> None:
        step = self.step
        if step is not None and (step.partition, step.source, step.now) == (
            partition,
            event.source,
            event.emitted_at,
        ):
            return
        self.close_step()
        step = _Step(partition=partition, source=event.source, now=event.emitted_at)
        step.eligible = list(self._eligible(step))
        self.step = step

    def _track(self, partition: int, job_id: str) -> None:
        state = self.replay.jobs.get(job_id)
        scheduled = self.scheduled.setdefault(partition, set())
        if state is not None and state.status is Status.SCHEDULED:
            scheduled.add(job_id)
        else:
            scheduled.discard(job_id)

    def _eligible(self, step: _Step) -> Iterator[JobState]:
        """The scheduled jobs of the step's partition the planner could lease at its clock and
        the node knew of; those of a paused queue or a limited queue or key are left out."""
        horizon = step.now + self.model.budgets.prelease_ms
        known_by = step.now - self.model.lag_ms
        paused = self.replay.paused(step.partition, QUEUE)
        for job_id in self.scheduled.get(step.partition, ()):
            state = self.replay.jobs[job_id]
            if (
                state.run_at <= horizon
                and state.updated_at <= known_by
                and state.queue not in paused
                and not self.limited.intersection(limit_names(state))
            ):
                yield state

    def close_step(self) -> None:
        step, self.step = self.step, None
        if step is None or not step.leases:
            return
        self.diff.note(ORDER, _order_divergence(step))


def _limit_of(event: Event) -> str:
    return limit_name(event)  # type: ignore[arg-type]


def _state_of(replay: Replay, event: Event) -> Any:
    if isinstance(event, ScheduleFired):
        return replay.schedules.get(event.schedule_id)
    job_id = getattr(event, "job_id", None)
    return None if job_id is None else replay.jobs.get(job_id)


def _judge(
    event: Decision, before: Any, model: DecisionModel, partition: int, offset: int
) -> tuple[str, Divergence | None]:
    """The kind of ``event`` and how the planner's decision from ``before`` differs, if it does."""
    now, source = event.emitted_at, event.source
    planned: list[Any]
    if isinstance(event, JobLeased):
        kind = LEASE
        leases = planner.plan_leases([before], {}, now=now, budgets=model.budgets, source=source)
        planned = [lease.event for lease in leases]
    elif isinstance(event, LeaseExpired):
        kind, planned = EXPIRY, planner.plan_expiries([before], now=now, source=source)
    elif isinstance(event, JobPurged):
        kind, planned = PURGE, planner.plan_purges([before], now=now, source=source)
    else:
        kind = FIRE
        planned = [fired for fired, _ in planner.plan_fires([before], now=now, source=source)]
    entity = event.schedule_id if isinstance(event, ScheduleFired) else event.job_id
    mine = planned[0] if planned else None
    if mine == event:
        return kind, None
    return kind, Divergence(
        kind=kind,
        entity=str(entity),
        partition=partition,
        offset=offset,
        recorded=_show(event),
        planned="nothing" if mine is None else _show(mine),
        why=_why_not(kind, before, now, model) if mine is None else _fields_differ(event, mine),
    )


def _show(event: Any) -> str:
    keys = {
        JobLeased: ("token", "attempt", "lease_ms", "not_before"),
        LeaseExpired: ("token",),
        JobPurged: ("generation",),
        ScheduleFired: ("fire_at", "job_id", "decision", "run_at"),
    }[type(event)]
    shown = " ".join(f"{k}={getattr(event, k)}" for k in keys)
    return f"{type(event).__name__} {shown}"


def _fields_differ(recorded: Any, planned: Any) -> str:
    names = [
        f.name for f in fields(recorded) if getattr(recorded, f.name) != getattr(planned, f.name)
    ]
    return "fields differ: " + ", ".join(names)


def _why_not(kind: str, state: Any, now: int, model: DecisionModel) -> str:
    if kind == LEASE:
        horizon = now + model.budgets.prelease_ms
        if state.status is not Status.SCHEDULED:
            return f"the job is {state.status.value}"
        return f"run_at {state.run_at} is past now + prelease_ms = {horizon}"
    if kind == EXPIRY:
        return f"lease_until {state.lease_until} is after now {now} (status {state.status.value})"
    if kind == PURGE:
        return f"not purgeable at {now} (status {state.status.value})"
    return f"no slot of the schedule is due at {now}"


def _order_divergence(step: _Step) -> Divergence | None:
    """Whether the step's leases are in the planner's order, and none of a queue passed over a
    job the planner would lease first (one the node knew of: folded ``lag_ms`` before the step)."""
    order = planner.due_order
    prior: tuple[JobState, int] | None = None
    for state, _event, offset in step.leases:
        if prior is not None and order(state) < order(prior[0]):
            return _order_report(step, state, prior[0], prior[1], "leased before")
        prior = (state, offset)
    last: dict[str, tuple[JobState, int]] = {}
    for state, _event, offset in step.leases:
        last[state.queue] = (state, offset)
    leased = {event.job_id for _, event, _ in step.leases}
    for other in step.eligible:
        tail = last.get(other.queue)
        if tail is not None and other.job_id not in leased and order(other) < order(tail[0]):
            return _order_report(step, other, tail[0], tail[1], "passed over")
    return None


def _order_report(
    step: _Step, first: JobState, then: JobState, offset: int, how: str
) -> Divergence:
    return Divergence(
        kind=ORDER,
        entity=then.job_id,
        partition=step.partition,
        offset=offset,
        recorded=f"lease {then.job_id} ({how} {first.job_id})",
        planned=f"lease {first.job_id} first",
        why=(
            f"due_order puts {first.job_id} (priority {first.priority}, run_at {first.run_at}) "
            f"ahead of {then.job_id} (priority {then.priority}, run_at {then.run_at})"
        ),
    )
