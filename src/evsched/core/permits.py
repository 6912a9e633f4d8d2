"""Global concurrency limits: a queue's permits, granted by its home partition, and their fold.

A limited queue's job is leased only once it holds a permit. Its partition proposes a
``PermitRequested``; applied, its node forwards a ``QueuePermit`` request to the queue's home
partition (the murmur2 partition of the queue name). The home's fold keeps the waiting requests and
the holders; its node proposes grants while holders stay under ``max_running``, and each applied
grant is forwarded to the job's partition as ``PermitGranted``. When the job stops holding a lease
or wanting one (it ends, retries, its lease expires, it is cancelled), its partition forwards a
release. A holder at the home outlives every lease of its job on the job's partition, so at any
log time the leased jobs of the queue are at most its holders, at most ``max_running``.

Each partition keeps one ``LimitState`` per limited queue: the limit itself (every partition folds
its own copy of ``QueueLimitSet``), the asks of its own jobs, and, on the home only, the waiting
requests and the holders. Forwards are derived from applied events only, so a refused proposal
sends nothing on.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace

from evsched.core import ids, limits
from evsched.core.events import (
    Event,
    JobEvent,
    JobLeased,
    LimitEvent,
    PermitEvent,
    PermitGranted,
    PermitRequested,
    Position,
    QueueLimitSet,
    QueuePermit,
)
from evsched.core.fold import RECENT_EVENT_IDS
from evsched.core.state import (
    ACTIVE_STATUSES,
    TERMINAL_STATUSES,
    JobState,
    Status,
    TimelineEntry,
    Verdict,
)


@dataclass(frozen=True, slots=True, kw_only=True)
class Ask:
    """One of this partition's jobs that asked its queue's home for a permit."""

    job_id: str
    granted: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class Waiter:
    """A request waiting at the home: higher priority first, then arrival (home offset)."""

    job_id: str
    priority: int
    offset: int


@dataclass(frozen=True, slots=True, kw_only=True)
class LimitState:
    """A queue's limit as one partition folded it; ``waiting``/``holders`` fill on its home only."""

    queue: str
    max_running: int | None
    updated_at: int
    asked: tuple[Ask, ...] = ()
    waiting: tuple[Waiter, ...] = ()
    holders: tuple[str, ...] = ()
    recent_event_ids: tuple[str, ...] = ()

    @property
    def limited(self) -> bool:
        return self.max_running is not None

    def ask(self, job_id: str) -> Ask | None:
        return next((a for a in self.asked if a.job_id == job_id), None)


# A fold step: the new state, the verdict, a reading of it, and the record to forward, if any.
Step = tuple[LimitState | None, Verdict, str, Event | None]


def _entry(event: Event, position: Position, verdict: Verdict, reason: str) -> TimelineEntry:
    return TimelineEntry(
        partition=position.partition,
        offset=position.offset,
        log_at=position.log_at,
        kind=type(event).__name__,
        event_id=event.event_id,
        source=event.source,
        verdict=verdict,
        reason=reason,
    )


def _marked(state: LimitState, event: Event, position: Position, **changes: object) -> LimitState:
    recent = (*state.recent_event_ids, event.event_id)[-RECENT_EVENT_IDS:]
    return replace(state, recent_event_ids=recent, updated_at=position.log_at, **changes)  # type: ignore[arg-type]


def _judged(
    state: LimitState | None, event: Event, position: Position, step: Callable[[], Step]
) -> tuple[LimitState | None, TimelineEntry, Event | None]:
    refusal = limits.refusal(event)
    if refusal is not None:
        return state, _entry(event, position, Verdict.REJECTED, refusal), None
    if state is not None and event.event_id in state.recent_event_ids:
        why = f"event {event.event_id} already applied"
        return state, _entry(event, position, Verdict.DUPLICATE, why), None
    new, verdict, reason, forward = step()
    if verdict is not Verdict.APPLIED:
        return state, _entry(event, position, verdict, reason), None
    return new, _entry(event, position, verdict, reason), forward


def fold_limit(
    state: LimitState | None, event: LimitEvent, position: Position
) -> tuple[LimitState | None, TimelineEntry, Event | None]:
    """A limit set, or a permit's step on the home; returns what to forward when applied."""
    fresh = state or LimitState(queue=event.queue, max_running=None, updated_at=position.log_at)
    if isinstance(event, QueueLimitSet):
        return _judged(state, event, position, lambda: _limit_set(fresh, event, position))
    return _judged(state, event, position, lambda: _home_step(fresh, event, position))


def _limit_set(state: LimitState, event: QueueLimitSet, position: Position) -> Step:
    limit = event.max_running
    new = _marked(state, event, position, max_running=limit)
    by = f" by {event.source}" + (f": {event.reason}" if event.reason else "")
    what = "limit removed" if limit is None else f"limited to {limit} running"
    return new, Verdict.APPLIED, f"queue {event.queue} {what}{by}", None


def _home_step(state: LimitState, event: QueuePermit, position: Position) -> Step:
    job_id = event.job_id
    waiting = any(w.job_id == job_id for w in state.waiting)
    holds = job_id in state.holders
    if event.action == "request":
        if waiting or holds:
            return state, Verdict.REJECTED, f"job {job_id} already {_has(holds)}", None
        waiter = Waiter(job_id=job_id, priority=event.priority, offset=position.offset)
        new = _marked(state, event, position, waiting=(*state.waiting, waiter))
        return new, Verdict.APPLIED, f"job {job_id} waits for a permit", None
    if event.action == "release":
        if not (waiting or holds):
            why = f"release for job {job_id}, which holds no permit and waits for none"
            return state, Verdict.REJECTED, why, None
        new = _marked(state, event, position, **_without(state, job_id))
        return (
            new,
            Verdict.APPLIED,
            f"job {job_id} {'released its permit' if holds else 'withdrew'}",
            None,
        )
    return _grant(state, event, position, waiting=waiting)


def _has(holds: bool) -> str:
    return "holds a permit" if holds else "waits for a permit"


def _without(state: LimitState, job_id: str) -> dict[str, object]:
    return {
        "waiting": tuple(w for w in state.waiting if w.job_id != job_id),
        "holders": tuple(h for h in state.holders if h != job_id),
    }


def _grant(state: LimitState, event: QueuePermit, position: Position, *, waiting: bool) -> Step:
    job_id, held, limit = event.job_id, len(state.holders), state.max_running
    if not waiting:
        why = f"grant for job {job_id}, which waits for no permit"
        return state, Verdict.REJECTED, why, None
    if limit is not None and held >= limit:
        why = f"grant beyond the limit: {held} of {limit} permits of queue {state.queue} held"
        return state, Verdict.REJECTED, why, None
    changes = _without(state, job_id)
    changes["holders"] = (*state.holders, job_id)
    new = _marked(state, event, position, **changes)
    forward = PermitGranted(
        event_id=ids.decision_event_id(job_id, "permit-granted", position.offset),
        job_id=job_id,
        emitted_at=position.log_at,
        source=event.source,
        queue=state.queue,
        trace=event.trace,
    )
    of = "" if limit is None else f" of {limit}"
    return new, Verdict.APPLIED, f"permit {held + 1}{of} granted to job {job_id}", forward


def fold_permit(
    state: LimitState | None, job: JobState | None, event: PermitEvent, position: Position
) -> tuple[LimitState | None, TimelineEntry, Event | None]:
    """A job's ask or grant on its own partition, judged against the job and the queue's limit."""
    after, entry, forward = _judged(
        state, event, position, lambda: _job_step(state, job, event, position)
    )
    return after, replace(entry, status_after=None if job is None else job.status), forward


def _job_step(
    state: LimitState | None, job: JobState | None, event: PermitEvent, position: Position
) -> Step:
    if job is None:
        return state, Verdict.REJECTED, "unknown job", None
    if job.queue != event.queue:
        return state, Verdict.REJECTED, f"job is on queue {job.queue}, not {event.queue}", None
    if state is None or not state.limited:
        return state, Verdict.REJECTED, f"queue {event.queue} has no concurrency limit", None
    if isinstance(event, PermitGranted):
        return _job_granted(state, job, event, position)
    return _job_asks(state, job, event, position)


def _job_granted(
    state: LimitState, job: JobState, event: PermitGranted, position: Position
) -> Step:
    ask = state.ask(job.job_id)
    if ask is None or ask.granted:
        why = "holds a permit already" if ask else "did not ask for a permit"
        return state, Verdict.REJECTED, f"grant rejected: job {why}", None
    asked = tuple(Ask(job_id=a.job_id, granted=a.granted or a is ask) for a in state.asked)
    new = _marked(state, event, position, asked=asked)
    return new, Verdict.APPLIED, f"permit of queue {event.queue} granted", None


def _job_asks(state: LimitState, job: JobState, event: PermitRequested, position: Position) -> Step:
    if job.status is not Status.SCHEDULED:
        return state, Verdict.REJECTED, f"cannot ask for a permit: job is {job.status}", None
    if state.ask(job.job_id) is not None:
        return state, Verdict.REJECTED, "job asked for a permit already", None
    asked = (*state.asked, Ask(job_id=job.job_id, granted=False))
    new = _marked(state, event, position, asked=asked)
    forward = _to_home(job, "request", position, event.source)
    return new, Verdict.APPLIED, f"asked queue {event.queue}'s home for a permit", forward


def _to_home(job: JobState, action: str, position: Position, source: str) -> QueuePermit:
    return QueuePermit(
        event_id=ids.decision_event_id(
            job.job_id, f"permit-{action}-p{position.partition}", position.offset
        ),
        queue=job.queue,
        job_id=job.job_id,
        action=action,
        emitted_at=position.log_at,
        source=source,
        priority=job.priority,
        trace=job.trace,
    )


def guard_job(
    state: LimitState | None,
    before: JobState | None,
    after: JobState | None,
    event: JobEvent,
    entry: TimelineEntry,
) -> tuple[JobState | None, TimelineEntry, LimitState | None, Event | None]:
    """The job fold's outcome under its queue's limit: a lease needs a granted permit, and a job
    that stops holding a lease or wanting one gives its permit back (the release to forward)."""
    if state is None or before is None or entry.verdict is not Verdict.APPLIED:
        return after, entry, state, None
    ask = state.ask(before.job_id)
    if isinstance(event, JobLeased) and state.limited and (ask is None or not ask.granted):
        why = f"cannot lease: queue {before.queue} is limited and the job holds no permit"
        refused = replace(entry, verdict=Verdict.REJECTED, reason=why, status_after=before.status)
        return before, refused, state, None
    if ask is None or not _gives_back(before, after):
        return after, entry, state, None
    asked = tuple(a for a in state.asked if a is not ask)
    position = Position(partition=entry.partition, offset=entry.offset, log_at=entry.log_at)
    release = _to_home(before, "release", position, entry.source)
    return after, entry, replace(state, asked=asked, updated_at=entry.log_at), release


def _gives_back(before: JobState, after: JobState | None) -> bool:
    if after is None or after.status in TERMINAL_STATUSES:
        return True
    return before.status in ACTIVE_STATUSES and after.status is Status.SCHEDULED


def plan_requests(
    candidates: Iterable[JobState],
    states: Mapping[str, LimitState],
    *,
    now: int,
    source: str,
    order: Callable[[JobState], tuple[int, int, str]],
) -> list[PermitRequested]:
    """Ask for permits for due jobs of limited queues that have not asked, best first; a
    partition keeps at most ``max_running`` asks per queue (it could not run more)."""
    room = {q: s.max_running - len(s.asked) for q, s in states.items() if s.max_running}
    asks: list[PermitRequested] = []
    for job in sorted(candidates, key=order):
        state = states.get(job.queue)
        if state is None or room.get(job.queue, 0) <= 0 or state.ask(job.job_id) is not None:
            continue
        room[job.queue] -= 1
        asks.append(
            PermitRequested(
                event_id=ids.decision_event_id(job.job_id, "permit-ask", job.updated_at),
                job_id=job.job_id,
                emitted_at=now,
                source=source,
                queue=job.queue,
                priority=job.priority,
                trace=job.trace,
            )
        )
    return asks


def plan_grants(
    state: LimitState, *, pending: Callable[[str], bool], now: int, source: str
) -> list[QueuePermit]:
    """Grants to the best waiting requests while holders and grants in flight stay in the limit."""
    order = sorted(state.waiting, key=lambda w: (-w.priority, w.offset))
    in_flight = [w for w in order if pending(w.job_id)]
    room = len(order) if state.max_running is None else state.max_running
    room -= len(state.holders) + len(in_flight)
    chosen = [w for w in order if not pending(w.job_id)][: max(room, 0)]
    return [
        QueuePermit(
            event_id=ids.decision_event_id(w.job_id, "permit-grant", w.offset),
            queue=state.queue,
            job_id=w.job_id,
            action="grant",
            emitted_at=now,
            source=source,
            priority=w.priority,
        )
        for w in chosen
    ]


def may_lease(state: LimitState | None, job_id: str) -> bool:
    """Whether the job may be leased as far as its queue's limit goes (holds a granted permit)."""
    if state is None or not state.limited:
        return True
    ask = state.ask(job_id)
    return ask is not None and ask.granted
