"""Global concurrency and rate limits: permits granted by a limit's home partition, and their fold.

A limit belongs to a queue (named by the queue) or to a concurrency key (named ``key:<key>``; a
job has one through its label ``evsched.concurrency_key``). A job under a limit is leased only
once it holds a permit of each of its limits. Its partition proposes a ``PermitRequested``;
applied, its node forwards a ``QueuePermit`` request to the limit's home (the murmur2 partition of
the limit's name). The home's fold keeps the waiting requests, the holders and, for a rate, the
log times of its latest grants; its node proposes grants while the limit has room, and each
applied grant is forwarded to the job's partition as ``PermitGranted``. When the job stops
holding a lease or wanting one (it ends, retries, its lease expires, it is cancelled), its
partition forwards a release. A holder at the home outlives every lease of its job, so at any log
time the leased jobs under a limit are at most its holders, at most ``max_running``.

Each partition keeps one ``LimitState`` per limit it folded: the limit itself (every partition
folds its own copy of the ``QueueLimitSet``/``KeyLimitSet``), the asks of its own jobs, and, on
the home only, the waiting requests, the holders and the grant times. Forwards are derived from
applied events only, so a refused proposal sends nothing on.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from evsched.core import bounds, ids, roles
from evsched.core.entries import judged
from evsched.core.events import (
    KEY_PREFIX,
    Event,
    JobEvent,
    JobLeased,
    KeyLimitSet,
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

# The label that gives a job its concurrency key; longer keys than this are not limited.
KEY_LABEL = "evsched.concurrency_key"
MAX_KEY_BYTES = bounds.MAX_CONCURRENCY_KEY_BYTES


@dataclass(frozen=True, slots=True, kw_only=True)
class Ask:
    """One of this partition's jobs that asked the limit's home for a permit."""

    job_id: str
    granted: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class Waiter:
    """A request waiting at the home: higher priority first, then arrival (home offset)."""

    job_id: str
    queue: str
    priority: int
    offset: int


@dataclass(frozen=True, slots=True, kw_only=True)
class LimitState:
    """A limit as one partition folded it; ``waiting``, ``holders`` and ``granted_at`` fill on
    its home only."""

    name: str
    max_running: int | None
    updated_at: int
    rate_starts: int | None = None
    rate_per_ms: int | None = None
    asked: tuple[Ask, ...] = ()
    waiting: tuple[Waiter, ...] = ()
    holders: tuple[str, ...] = ()
    granted_at: tuple[int, ...] = ()
    recent_event_ids: tuple[str, ...] = ()

    @property
    def limited(self) -> bool:
        return self.max_running is not None or self.rate_starts is not None

    def ask(self, job_id: str) -> Ask | None:
        return next((a for a in self.asked if a.job_id == job_id), None)

    def granted_since(self, since: int) -> int:
        """Grants at log times after ``since`` (the rate's window)."""
        return sum(1 for at in self.granted_at if at > since)


def concurrency_key(job: JobState) -> str | None:
    """The job's concurrency key, if it has a usable one."""
    key = job.labels.get(KEY_LABEL)
    if key is None or not key or len(key.encode()) > MAX_KEY_BYTES:
        return None
    return key


def limit_names(job: JobState) -> tuple[str, ...]:
    """The names of the limits that may hold for ``job``, in the order it acquires their
    permits: its key's, then its queue's. One order for every job means no two jobs ever wait
    for each other's permit (no deadlock), and a job waiting for its key's permit holds no slot
    of its queue."""
    key = concurrency_key(job)
    return (job.queue,) if key is None else (KEY_PREFIX + key, job.queue)


def _name(event: LimitEvent | PermitEvent) -> str:
    if isinstance(event, KeyLimitSet):
        return KEY_PREFIX + event.key
    if isinstance(event, QueueLimitSet) or event.key is None:
        return event.queue
    return KEY_PREFIX + event.key


# A fold step: the new state, the verdict, a reading of it, and the record to forward, if any.
Step = tuple[LimitState | None, Verdict, str, Event | None]
Folded = tuple[LimitState | None, TimelineEntry, Event | None]


def _marked(state: LimitState, event: Event, position: Position, **changes: Any) -> LimitState:
    recent = (*state.recent_event_ids, event.event_id)[-RECENT_EVENT_IDS:]
    return replace(state, recent_event_ids=recent, updated_at=position.log_at, **changes)


def _judged(
    state: LimitState | None, event: Event, position: Position, step: Callable[[], Step]
) -> Folded:
    refusal = bounds.refusal(event) or roles.refusal(event, position)
    if refusal is not None:
        return state, judged(event, position, Verdict.REJECTED, refusal), None
    if state is not None and event.event_id in state.recent_event_ids:
        why = f"event {event.event_id} already applied"
        return state, judged(event, position, Verdict.DUPLICATE, why), None
    new, verdict, reason, forward = step()
    if verdict is not Verdict.APPLIED:
        return state, judged(event, position, verdict, reason), None
    return new, judged(event, position, verdict, reason), forward


def limit_name(event: LimitEvent | PermitEvent) -> str:
    """The name of the limit ``event`` is about (its state's key on every partition)."""
    return _name(event)


def fold_limit(state: LimitState | None, event: LimitEvent, position: Position) -> Folded:
    """A limit set, or a permit's step on the home; returns what to forward when applied."""
    name = _name(event)
    fresh = state or LimitState(name=name, max_running=None, updated_at=position.log_at)
    if isinstance(event, QueueLimitSet | KeyLimitSet):
        return _judged(state, event, position, lambda: _limit_set(fresh, event, position))
    return _judged(state, event, position, lambda: _home_step(fresh, event, position))


def _limit_set(state: LimitState, event: QueueLimitSet | KeyLimitSet, position: Position) -> Step:
    new = _marked(
        state,
        event,
        position,
        max_running=event.max_running,
        rate_starts=event.rate_starts,
        rate_per_ms=event.rate_per_ms,
    )
    by = f" by {event.source}" + (f": {event.reason}" if event.reason else "")
    return new, Verdict.APPLIED, f"{_title(state.name)} {_what(new)}{by}", None


def _title(name: str) -> str:
    return (
        f"key {name.removeprefix(KEY_PREFIX)}" if name.startswith(KEY_PREFIX) else f"queue {name}"
    )


def _what(state: LimitState) -> str:
    parts = []
    if state.max_running is not None:
        parts.append(f"at most {state.max_running} running")
    if state.rate_starts is not None:
        parts.append(f"at most {state.rate_starts} starts per {state.rate_per_ms} ms")
    return "limited to " + " and ".join(parts) if parts else "no longer limited"


def _home_step(state: LimitState, event: QueuePermit, position: Position) -> Step:
    job_id = event.job_id
    waiting = any(w.job_id == job_id for w in state.waiting)
    holds = job_id in state.holders
    if event.action == "request":
        if waiting or holds:
            has = "holds a permit" if holds else "waits for a permit"
            return state, Verdict.REJECTED, f"job {job_id} already {has}", None
        waiter = Waiter(
            job_id=job_id, queue=event.queue, priority=event.priority, offset=position.offset
        )
        new = _marked(state, event, position, waiting=(*state.waiting, waiter))
        return new, Verdict.APPLIED, f"job {job_id} waits for a permit", None
    if event.action == "release":
        if not (waiting or holds):
            why = f"release for job {job_id}, which holds no permit and waits for none"
            return state, Verdict.REJECTED, why, None
        new = _marked(state, event, position, **_without(state, job_id))
        done = "released its permit" if holds else "withdrew its request"
        return new, Verdict.APPLIED, f"job {job_id} {done}", None
    return _grant(state, event, position, waiting=waiting)


def _without(state: LimitState, job_id: str) -> dict[str, Any]:
    return {
        "waiting": tuple(w for w in state.waiting if w.job_id != job_id),
        "holders": tuple(h for h in state.holders if h != job_id),
    }


def _grant(state: LimitState, event: QueuePermit, position: Position, *, waiting: bool) -> Step:
    job_id, held, limit = event.job_id, len(state.holders), state.max_running
    if not waiting:
        return state, Verdict.REJECTED, f"grant for job {job_id}, which waits for no permit", None
    if limit is not None and held >= limit:
        why = f"grant beyond the limit: {held} of {limit} permits of {_title(state.name)} held"
        return state, Verdict.REJECTED, why, None
    if (too_soon := _rate_refusal(state, position.log_at)) is not None:
        return state, Verdict.REJECTED, too_soon, None
    changes = _without(state, job_id)
    changes["holders"] = (*state.holders, job_id)
    if state.rate_starts is not None:
        changes["granted_at"] = (*state.granted_at, position.log_at)[-state.rate_starts :]
    new = _marked(state, event, position, **changes)
    forward = PermitGranted(
        event_id=ids.decision_event_id(job_id, f"permit-granted-{state.name}", position.offset),
        job_id=job_id,
        emitted_at=position.log_at,
        source=event.source,
        queue=event.queue,
        key=event.key,
        trace=event.trace,
    )
    of = "" if limit is None else f" of {limit}"
    return new, Verdict.APPLIED, f"permit {held + 1}{of} granted to job {job_id}", forward


def _rate_refusal(state: LimitState, at: int) -> str | None:
    starts, per = state.rate_starts, state.rate_per_ms
    if starts is None or per is None:
        return None
    granted = state.granted_since(at - per)
    if granted < starts:
        return None
    return f"grant beyond the rate: {granted} of {starts} permits granted in the last {per} ms"


def fold_permit(
    state: LimitState | None, job: JobState | None, event: PermitEvent, position: Position
) -> Folded:
    """A job's ask or grant on its own partition, judged against the job and the limit.

    A refused grant of a job that holds no ask (unknown, or it gave its ask back meanwhile) is
    released at once, so a grant nobody can use never keeps a holder at the home.
    """
    after, entry, forward = _judged(
        state, event, position, lambda: _job_step(state, job, event, position)
    )
    entry = replace(entry, status_after=None if job is None else job.status)
    if isinstance(event, PermitGranted) and _unused(state, event, entry):
        forward = _release_unused(event, position)
    return after, entry, forward


def _unused(state: LimitState | None, event: PermitGranted, entry: TimelineEntry) -> bool:
    """Whether a refused grant belongs to no ask of this partition (nobody can use it); an
    unproven one granted nothing (core.roles): no home holds it, so nothing is given back."""
    if entry.verdict is not Verdict.REJECTED or roles.is_unproven(entry.reason):
        return False
    return state is None or state.ask(event.job_id) is None


def _release_unused(event: PermitGranted, position: Position) -> QueuePermit:
    name = event.queue if event.key is None else KEY_PREFIX + event.key
    return QueuePermit(
        event_id=ids.decision_event_id(
            event.job_id, f"permit-unused-{name}-p{position.partition}", position.offset
        ),
        queue=event.queue,
        job_id=event.job_id,
        action="release",
        emitted_at=position.log_at,
        source=event.source,
        key=event.key,
        trace=event.trace,
    )


def _job_step(
    state: LimitState | None, job: JobState | None, event: PermitEvent, position: Position
) -> Step:
    if job is None:
        return state, Verdict.REJECTED, "unknown job", None
    name = _name(event)
    if name not in limit_names(job):
        return state, Verdict.REJECTED, f"no {_title(name)} limit holds for this job", None
    if state is None or not state.limited:
        return state, Verdict.REJECTED, f"{_title(name)} has no limit", None
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
    return new, Verdict.APPLIED, f"permit of {_title(state.name)} granted", None


def _job_asks(state: LimitState, job: JobState, event: PermitRequested, position: Position) -> Step:
    if job.status is not Status.SCHEDULED:
        return state, Verdict.REJECTED, f"cannot ask for a permit: job is {job.status}", None
    if state.ask(job.job_id) is not None:
        return state, Verdict.REJECTED, "job asked for a permit already", None
    asked = (*state.asked, Ask(job_id=job.job_id, granted=False))
    new = _marked(state, event, position, asked=asked)
    forward = _to_home(job, state.name, "request", position, event.source)
    return new, Verdict.APPLIED, f"asked the home of {_title(state.name)} for a permit", forward


def _to_home(job: JobState, name: str, action: str, position: Position, source: str) -> QueuePermit:
    return QueuePermit(
        event_id=ids.decision_event_id(
            job.job_id, f"permit-{action}-{name}-p{position.partition}", position.offset
        ),
        queue=job.queue,
        job_id=job.job_id,
        action=action,
        emitted_at=position.log_at,
        source=source,
        key=name.removeprefix(KEY_PREFIX) if name.startswith(KEY_PREFIX) else None,
        priority=job.priority,
        trace=job.trace,
    )


def guard_job(
    state: LimitState,
    before: JobState | None,
    after: JobState | None,
    event: JobEvent,
    entry: TimelineEntry,
) -> tuple[JobState | None, TimelineEntry, LimitState, Event | None]:
    """The job fold's outcome under one of its limits: a lease needs a granted permit, and a job
    that stops holding a lease or wanting one gives its permit back (the release to forward)."""
    if before is None or entry.verdict is not Verdict.APPLIED:
        return after, entry, state, None
    ask = state.ask(before.job_id)
    if isinstance(event, JobLeased) and state.limited and (ask is None or not ask.granted):
        why = f"cannot lease: {_title(state.name)} is limited and the job holds no permit"
        refused = replace(entry, verdict=Verdict.REJECTED, reason=why, status_after=before.status)
        return before, refused, state, None
    if ask is None or not _gives_back(before, after):
        return after, entry, state, None
    asked = tuple(a for a in state.asked if a is not ask)
    position = Position(partition=entry.partition, offset=entry.offset, log_at=entry.log_at)
    release = _to_home(before, state.name, "release", position, entry.source)
    return after, entry, replace(state, asked=asked, updated_at=entry.log_at), release


def _gives_back(before: JobState, after: JobState | None) -> bool:
    if after is None or after.status in TERMINAL_STATUSES:
        return True
    return before.status in ACTIVE_STATUSES and after.status is Status.SCHEDULED


def may_lease(states: Mapping[str, LimitState], job: JobState) -> bool:
    """Whether ``job`` holds a granted permit of every limit that holds for it."""
    for name in limit_names(job):
        state = states.get(name)
        if state is not None and state.limited:
            ask = state.ask(job.job_id)
            if ask is None or not ask.granted:
                return False
    return True


def waiting_for_grant(states: Mapping[str, LimitState], job: JobState) -> bool:
    """Whether ``job`` asked for a permit it has not been granted yet (it waits for a record)."""
    for name in limit_names(job):
        state = states.get(name)
        ask = None if state is None else state.ask(job.job_id)
        if ask is not None and not ask.granted:
            return True
    return False


def plan_requests(
    candidates: Iterable[JobState],
    states: Mapping[str, LimitState],
    *,
    now: int,
    source: str,
    order: Callable[[JobState], tuple[int, int, str]],
) -> list[PermitRequested]:
    """Ask for the next permit each due job lacks (in ``limit_names`` order: one limit at a time),
    best jobs first; a partition keeps at most ``max_running`` (or ``rate_starts``) asks per
    limit, as it could not use more at once."""
    room = {name: _ask_room(state) for name, state in states.items()}
    asks: list[PermitRequested] = []
    for job in sorted(candidates, key=order):
        name = _next_limit(states, job)
        if name is not None and room[name] > 0:
            room[name] -= 1
            asks.append(_request(job, name, now=now, source=source))
    return asks


def _next_limit(states: Mapping[str, LimitState], job: JobState) -> str | None:
    """The first limit whose permit ``job`` has not asked for yet, unless it waits for one."""
    for name in limit_names(job):
        state = states.get(name)
        if state is None or not state.limited:
            continue
        ask = state.ask(job.job_id)
        if ask is None:
            return name
        if not ask.granted:
            return None
    return None


def _ask_room(state: LimitState) -> int:
    most = state.max_running if state.max_running is not None else state.rate_starts
    return 0 if most is None else most - len(state.asked)


def _request(job: JobState, name: str, *, now: int, source: str) -> PermitRequested:
    key = name.removeprefix(KEY_PREFIX) if name.startswith(KEY_PREFIX) else None
    return PermitRequested(
        event_id=ids.decision_event_id(job.job_id, f"permit-ask-{name}", job.updated_at),
        job_id=job.job_id,
        emitted_at=now,
        source=source,
        queue=job.queue,
        key=key,
        priority=job.priority,
        trace=job.trace,
    )


# A node's clock and the broker's log time differ a little: a rate's window is taken this much
# longer when planning, so a grant is not proposed just before the home's fold would allow it.
RATE_MARGIN_MS = 100


def plan_grants(
    state: LimitState, *, pending: Callable[[str], bool], now: int, source: str
) -> list[QueuePermit]:
    """Grants to the best waiting requests while holders, grants in flight and the rate's
    window leave room."""
    order = sorted(state.waiting, key=lambda w: (-w.priority, w.offset))
    in_flight = sum(1 for w in order if pending(w.job_id))
    room = len(order)
    if state.max_running is not None:
        room = min(room, state.max_running - len(state.holders))
    if state.rate_starts is not None and state.rate_per_ms is not None:
        since = now - state.rate_per_ms - RATE_MARGIN_MS
        room = min(room, state.rate_starts - state.granted_since(since))
    chosen = [w for w in order if not pending(w.job_id)][: max(room - in_flight, 0)]
    key = state.name.removeprefix(KEY_PREFIX) if state.name.startswith(KEY_PREFIX) else None
    return [
        QueuePermit(
            event_id=ids.decision_event_id(w.job_id, f"permit-grant-{state.name}", w.offset),
            queue=w.queue,
            job_id=w.job_id,
            action="grant",
            emitted_at=now,
            source=source,
            key=key,
            priority=w.priority,
        )
        for w in chosen
    ]


def next_grant_at(state: LimitState, now: int) -> int | None:
    """When a rate-limited home with waiting requests next has room (None: not rate-bound)."""
    starts, per = state.rate_starts, state.rate_per_ms
    if not state.waiting or starts is None or per is None:
        return None
    window = [at for at in state.granted_at if at > now - per - RATE_MARGIN_MS]
    if len(window) < starts:
        return None
    return window[-starts] + per + RATE_MARGIN_MS + 1
