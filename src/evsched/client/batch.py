"""Batch enqueue: many jobs in one round trip, each with its own verdict, optionally all or none.

``app.enqueue_many([task.call(...), task.options(...).call(...)])`` checks every call, hands
every record to the producer before waiting for any acknowledgement (so they share produce
requests), and answers per call. With ``atomic=True`` the records go in one Kafka transaction:
all are written or none, and an invalid call fails the whole batch before anything is sent.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

from evsched.client.workflows import registrations
from evsched.commands import encode_checked
from evsched.core.events import JobEnqueued
from evsched.core.workflow.graph import waiting_cycle
from evsched.errors import InvalidEnqueue, PublishError
from evsched.ports import Appended, EventLog, Outbound

# Above this many calls a batch is refused: one batch should fit a few produce requests.
MAX_BATCH = 10_000


class Outcome(enum.StrEnum):
    ACCEPTED = "accepted"  # acknowledged by the broker (acks=all)
    DUPLICATE = "duplicate"  # same idempotency key and body as an earlier call of the batch
    CONFLICT = "conflict"  # same idempotency key as an earlier call, another body: not written
    INVALID = "invalid"  # refused by the checks; ``field`` names what is wrong
    FAILED = "failed"  # the broker did not take it (or the atomic batch was not written)


_REFUSED = frozenset({Outcome.INVALID, Outcome.CONFLICT})


@dataclass(frozen=True, slots=True, kw_only=True)
class BatchResult:
    """One call's verdict; ``job_id`` is set for every call that got as far as an id."""

    index: int
    outcome: Outcome
    job_id: str | None = None
    field: str | None = None
    message: str = ""
    appended: Appended | None = None


@dataclass(slots=True)
class _Prepared:
    index: int
    event: JobEnqueued
    data: bytes


async def write_batch(
    log: EventLog,
    topic: str,
    items: Sequence[JobEnqueued | InvalidEnqueue],
    *,
    atomic: bool,
) -> list[BatchResult]:
    """Write already built enqueues (an InvalidEnqueue for a refused one) in one round trip; a
    result per item, in the items' order.

    Raises InvalidEnqueue before anything is written when the batch's jobs wait on one another
    in a cycle (``refuse_cycles``).
    """
    refuse_cycles(items)
    results: list[BatchResult | None] = [None] * len(items)
    ready: list[_Prepared] = []
    seen: dict[str, bytes | None] = {}
    for index, item in enumerate(items):
        try:
            if isinstance(item, InvalidEnqueue):
                raise item
            data = encode_checked(item)
        except InvalidEnqueue as exc:
            results[index] = _invalid(index, exc)
            continue
        results[index] = _repeat(index, item, seen)
        if results[index] is None:
            seen[item.job_id] = item.body_digest
            ready.append(_Prepared(index, item, data))
    return await _write(log, topic, results, ready, atomic=atomic)


async def _write(
    log: EventLog,
    topic: str,
    results: list[BatchResult | None],
    ready: list[_Prepared],
    *,
    atomic: bool,
) -> list[BatchResult]:
    if not atomic:  # a waiting job's registrations must go in its enqueue's transaction
        ready = _without_after(results, ready)
    refused = [i for i, r in enumerate(results) if r is not None and r.outcome in _REFUSED]
    if atomic and refused:
        return _abort(results, ready, f"call {refused[0]} is refused: nothing was written")
    records = [Outbound(p.event.job_id, p.data) for p in ready]
    if atomic:
        records += [
            Outbound(r.job_id, encode_checked(r))
            for p in ready
            for r in registrations(p.event, p.event.emitted_at)
        ]
        try:
            acks: Sequence[Appended | PublishError] = await log.append_atomic(topic, records)
        except PublishError as exc:
            return _abort(results, ready, str(exc))
        acks = acks[: len(ready)]
    else:
        acks = await log.append_many(topic, records)
    for prepared, ack in zip(ready, acks, strict=True):
        results[prepared.index] = _written(prepared, ack)
    return [r for r in results if r is not None]


def refuse_cycles(items: Sequence[JobEnqueued | InvalidEnqueue]) -> None:
    """Raise InvalidEnqueue naming the jobs when some of ``items`` wait on one another in a
    cycle: none of them could ever be released, atomic batch or not."""
    after: dict[str, tuple[str, ...]] = {}
    for item in items:
        if isinstance(item, JobEnqueued):
            after.setdefault(item.job_id, item.after)
    found = waiting_cycle(after)
    if found is not None:
        loop = " -> ".join(found)
        why = f"the batch's jobs wait on one another in a cycle, so none would ever run: {loop}"
        raise InvalidEnqueue("after", why)


def _without_after(results: list[BatchResult | None], ready: list[_Prepared]) -> list[_Prepared]:
    """The calls that wait on no parent; the others are invalid outside an atomic batch."""
    for p in ready:
        if p.event.after:
            why = "a call with after needs atomic=True (its registrations share its transaction)"
            results[p.index] = _invalid(p.index, InvalidEnqueue("after", why))
    return [p for p in ready if not p.event.after]


def _invalid(index: int, exc: InvalidEnqueue) -> BatchResult:
    return BatchResult(index=index, outcome=Outcome.INVALID, field=exc.field, message=exc.reason)


def _repeat(index: int, event: JobEnqueued, seen: dict[str, bytes | None]) -> BatchResult | None:
    """The verdict of a keyed call whose job id an earlier call of the batch already took."""
    if event.job_id not in seen:
        return None
    same = seen[event.job_id] == event.body_digest
    return BatchResult(
        index=index,
        outcome=Outcome.DUPLICATE if same else Outcome.CONFLICT,
        job_id=event.job_id,
        field=None if same else "idempotency_key",
        message="same key and body as an earlier call of the batch"
        if same
        else "idempotency key used by an earlier call of the batch with another body",
    )


def _written(prepared: _Prepared, ack: Appended | PublishError) -> BatchResult:
    if isinstance(ack, PublishError):
        return BatchResult(
            index=prepared.index,
            outcome=Outcome.FAILED,
            job_id=prepared.event.job_id,
            message=str(ack),
        )
    return BatchResult(
        index=prepared.index, outcome=Outcome.ACCEPTED, job_id=prepared.event.job_id, appended=ack
    )


def _abort(
    results: list[BatchResult | None], ready: list[_Prepared], why: str
) -> list[BatchResult]:
    """An atomic batch that was not written: its valid calls fail with ``why``."""
    for prepared in ready:
        results[prepared.index] = BatchResult(
            index=prepared.index,
            outcome=Outcome.FAILED,
            job_id=prepared.event.job_id,
            message=why,
        )
    return [r for r in results if r is not None]
