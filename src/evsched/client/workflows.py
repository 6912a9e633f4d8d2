"""Workflows for the client: ``chain``, ``group`` (with a callback) and ``after=``, on the log.

A workflow is planned into jobs that wait on one another (``JobEnqueued.after``, see
``core.workflow.waits``) and written in one Kafka transaction: every job's enqueue and, after its
parents' enqueues, one ``ChildRegistered`` per parent. Results travel in the log: a chain step
gets the previous step's result appended to its positional args, a group's callback one more
positional arg, the list of the members' results in member order. Under a ``key`` every job's id
derives from it, so the same workflow enqueued again makes no new jobs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, TypeAlias

from evsched.adapters.ids import new_id
from evsched.client.results import JobHandle
from evsched.commands import SOURCE, args_bytes, build_enqueue, check_limits, encode_checked
from evsched.core.events import ChildRegistered, Event, JobEnqueued, entity_id
from evsched.errors import InvalidEnqueue
from evsched.ports import Appended, Outbound

if TYPE_CHECKING:
    from evsched.client.app import App
    from evsched.client.task import EnqueueCall


@dataclass(frozen=True, slots=True)
class Chain:
    """Steps run one after another, each getting the previous one's result (or results)."""

    steps: tuple[Step, ...]


@dataclass(frozen=True, slots=True)
class Group:
    """Members run side by side; the callback, if any, gets the list of their results."""

    members: tuple[Step, ...]
    callback: Step | None = None


Step: TypeAlias = "EnqueueCall | Chain | Group"


def chain(*steps: EnqueueCall | Chain | Group) -> Chain:
    """``chain(a.s(1), b.s(), c.s())``: b gets a's result as its last argument, c gets b's."""
    if not steps:
        raise InvalidEnqueue("steps", "a chain needs at least one step")
    return Chain(tuple(steps))


def group(
    members: Sequence[EnqueueCall | Chain | Group], callback: EnqueueCall | Chain | None = None
) -> Group:
    """``group([a.s(1), a.s(2)], callback=total.s())``: total gets ``[r1, r2]`` as last argument."""
    if not members:
        raise InvalidEnqueue("members", "a group needs at least one member")
    return Group(tuple(members), callback)


@dataclass(frozen=True, slots=True)
class _Planned:
    call: EnqueueCall
    after: tuple[int, ...]  # indexes of earlier planned jobs
    placement: str


@dataclass(frozen=True, slots=True)
class WorkflowHandle:
    """The jobs of an enqueued workflow, in plan order; ``last`` is the one that ends it."""

    jobs: tuple[JobHandle, ...]
    tails: tuple[JobHandle, ...]

    @property
    def last(self) -> JobHandle:
        return self.tails[-1]

    @property
    def job_ids(self) -> list[str]:
        return [str(job) for job in self.jobs]


def plan(step: EnqueueCall | Chain | Group) -> tuple[list[_Planned], list[int]]:
    """The jobs of ``step`` in an order where parents come first, and the indexes ending it."""
    planned: list[_Planned] = []
    tails = _plan(step, planned, (), "none")
    return planned, tails


def _plan(
    step: EnqueueCall | Chain | Group, out: list[_Planned], after: tuple[int, ...], place: str
) -> list[int]:
    if isinstance(step, Chain):
        tails = list(after)
        for index, link in enumerate(step.steps):
            here = place if index == 0 else ("append" if len(tails) == 1 else "list")
            tails = _plan(link, out, tuple(tails), here)
        return tails
    if isinstance(step, Group):
        ends = [end for member in step.members for end in _plan(member, out, after, place)]
        if step.callback is None:
            return ends
        return _plan(step.callback, out, tuple(ends), "list")
    out.append(_Planned(step, after, place if after else "none"))
    return [len(out) - 1]


def build(
    step: EnqueueCall | Chain | Group, *, now_ms: int, key: str | None = None
) -> tuple[list[JobEnqueued], list[Event], list[int]]:
    """The enqueues, every event to write (enqueues and registrations) and the tails' indexes."""
    planned, tails = plan(step)
    enqueues: list[JobEnqueued] = []
    events: list[Event] = []
    for index, job in enumerate(planned):
        parents = tuple(enqueues[i].job_id for i in job.after)
        keyed = None if key is None else f"{key}/{index}"
        # The handler is checked with the results it will get: one per parent, or their list.
        extra = {"none": 0, "append": len(parents), "list": 1}[job.placement]
        event = enqueue_event(job.call, now_ms=now_ms, key=keyed, after=parents, extra=extra)
        if job.placement != "none":
            event = check_limits(replace(event, results_to_args=job.placement))
        enqueues.append(event)
        events += [event, *registrations(event, now_ms)]
    return enqueues, events, tails


def enqueue_event(
    call: EnqueueCall,
    *,
    now_ms: int,
    key: str | None,
    after: tuple[str, ...] = (),
    extra: int = 0,
) -> JobEnqueued:
    """The JobEnqueued of one call, waiting on ``after`` (with the call's rule, if it set one);
    its handler must take ``extra`` more positional args (the parents' results)."""
    options = call.options.traced()
    options.task.check_call((*call.args, *[None] * extra), call.kwargs)
    values = options.values
    if key is not None:
        values = replace(values, idempotency_key=key)
    if after:
        values = replace(values, after=tuple(values.after or ()) + after)
    return build_enqueue(
        options.task.spec,
        args_bytes(call.args, call.kwargs),
        values,
        now_ms=now_ms,
        new_id=new_id,
        defaults=options.task.app.settings,
    )


def registrations(event: JobEnqueued, now_ms: int) -> list[ChildRegistered]:
    """One ChildRegistered per parent of ``event``, keyed by the parent."""
    return [
        ChildRegistered(
            event_id=new_id(),
            job_id=parent,
            emitted_at=now_ms,
            source=SOURCE,
            child_id=event.job_id,
            trace=event.trace,
        )
        for parent in event.after
    ]


async def write_atomically(app: App, events: Sequence[Event]) -> list[Appended]:
    """Every event in one Kafka transaction (all or none), after the queue checks."""
    records = [Outbound(entity_id(event), encode_checked(event)) for event in events]
    for queue in sorted({e.queue for e in events if isinstance(e, JobEnqueued)}):
        await app.require_queue(queue)
    log = await app.event_log()
    return list(await log.append_atomic(app.topics.events, records))


async def enqueue_workflow(
    app: App, step: EnqueueCall | Chain | Group, *, key: str | None = None
) -> WorkflowHandle:
    """Write the whole workflow atomically; its handle once the transaction committed."""
    enqueues, events, tails = build(step, now_ms=app.clock.now_ms(), key=key)
    appended = await write_atomically(app, events)
    where = {
        e.job_id: a for e, a in zip(events, appended, strict=True) if isinstance(e, JobEnqueued)
    }
    handles = tuple(_handle(app, e, where[e.job_id], keyed=key is not None) for e in enqueues)
    return WorkflowHandle(jobs=handles, tails=tuple(handles[i] for i in tails))


def _handle(app: App, event: JobEnqueued, at: Appended, *, keyed: bool) -> JobHandle:
    # A keyed job's first enqueue may be older than this one: followed from the partition's start.
    return JobHandle(event.job_id, app, partition=at.partition, offset=None if keyed else at.offset)
