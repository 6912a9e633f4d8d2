"""Workflows: a job waits on parent jobs and is released, exactly once, by their accepted ends.

A child's enqueue names its parents (``after``) and is written in one transaction with a
ChildRegistered per parent, keyed by the parent. The parent's fold keeps its children; when it
folds the parent's applied end (succeeded, dead, cancelled), or a registration arriving after that
end, its node sends a ParentResolved keyed by the child in the transaction that carries the
records' offset, as it does effects: so each lands on the child's partition once. The child's fold
records each parent's outcome once (a repeat is a duplicate) and applies its rule: released
(scheduled, due now) when met, cancelled with the reason when it can no longer be met. Only an
applied verdict sends anything: a stale or rejected completion releases nothing.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from evsched.core import bounds
from evsched.core.events import ChildRegistered, JobEvent, ParentResolved, Position
from evsched.core.ids import resolution_id
from evsched.core.state import TERMINAL_STATUSES, JobState, Resolution, Status, Verdict

# The rules (bounds.AFTER_RULES): released when all parents succeeded, when all ended, or when
# one succeeded.
ALL_FINISHED, ANY_SUCCEEDED = "all_finished", "any_succeeded"
# Where the parents' results go in a released child's args (bounds.RESULT_PLACEMENTS): nowhere;
# each appended to its positional args in ``after`` order; or one positional arg, their list.
NONE, APPEND = "none", "append"
# A parent the registration found no job for (never enqueued, or purged), or one with too many
# children: the child cannot wait on it.
UNKNOWN, REFUSED = "unknown", "refused"

Step = tuple[JobState | None, Verdict, str]
# fold._applied: the state after an applied event, with the marks every applied event records.
Applier = Callable[..., JobState]


def registered(
    state: JobState | None, event: ChildRegistered, pos: Position, apply: Applier
) -> Step:
    """A child registers with its parent (this job); refused for an unknown parent, too many
    children, or a child this job itself waits on (a cycle of two)."""
    if state is None:
        return None, Verdict.REJECTED, "unknown parent job"
    child = event.child_id
    if child in state.children:
        return state, Verdict.DUPLICATE, f"child {child} already registered"
    if child in state.after:
        # The two would wait on each other for ever (a foreign producer's batch): the child is
        # answered ``refused``, so neither waits on the other.
        why = f"cycle: this job waits on {child}, so {child} cannot wait on it"
        return state, Verdict.REJECTED, why
    if len(state.children) >= bounds.MAX_CHILDREN:
        why = f"job has {len(state.children)} children, the limit is {bounds.MAX_CHILDREN}"
        return state, Verdict.REJECTED, why
    new = apply(state, event, pos, children=(*state.children, child))
    ended = f"; parent already {state.status}, answered at once" if _ended(state) else ""
    return new, Verdict.APPLIED, f"child {child} registered{ended}"


def resolved(state: JobState | None, event: ParentResolved, pos: Position, apply: Applier) -> Step:
    """Record one parent's outcome, once; release or cancel the child when its rule says so."""
    if state is None:
        return None, Verdict.REJECTED, "unknown job"
    parent = event.parent_id
    if parent not in state.after:
        return state, Verdict.REJECTED, f"job does not wait on {parent}"
    if any(r.parent_id == parent for r in state.resolutions):
        return state, Verdict.DUPLICATE, f"parent {parent} already resolved"
    result, too_much = _kept_result(state.resolutions, event.result)
    resolution = Resolution(
        parent_id=parent,
        outcome=event.outcome,
        partition=event.parent_partition,
        offset=event.parent_offset,
        result=result,
    )
    done = (*state.resolutions, resolution)
    at = f"parent {parent} {event.outcome} at {event.parent_partition}@{event.parent_offset}"
    if state.status is not Status.WAITING:
        kept = apply(state, event, pos, resolutions=done)
        return kept, Verdict.APPLIED, f"{at}; recorded (job is already {state.status})"
    if too_much and state.results_to_args != NONE:
        gone = apply(state, event, pos, status=Status.CANCELLED, resolutions=done)
        why = f"{at}: the parents' results exceed {bounds.MAX_RESULTS_BYTES} bytes, cancelled"
        return gone, Verdict.APPLIED, why
    return _decide(state, event, pos, apply, done=done, at=at)


def _kept_result(kept: tuple[Resolution, ...], result: bytes | None) -> tuple[bytes | None, bool]:
    """The result to keep, and whether it was dropped: the results a job keeps stay within
    ``bounds.MAX_RESULTS_BYTES`` all together, so its state always fits a changelog record."""
    if result is None:
        return None, False
    held = sum(len(r.result) for r in kept if r.result is not None)
    if held + len(result) > bounds.MAX_RESULTS_BYTES:
        return None, True
    return result, False


def _decide(
    state: JobState,
    event: ParentResolved,
    pos: Position,
    apply: Applier,
    *,
    done: tuple[Resolution, ...],
    at: str,
) -> Step:
    """A waiting child after one more resolution: released, cancelled, or still waiting."""
    match rule_outcome(state.after_rule, state.after, done):
        case "release":
            return _release(state, event, pos, apply, done=done, at=at)
        case "give_up":
            gone = apply(state, event, pos, status=Status.CANCELLED, resolutions=done)
            why = f"{at}: rule {state.after_rule} can no longer be met, cancelled"
            return gone, Verdict.APPLIED, why
        case _:
            waiting = apply(state, event, pos, resolutions=done)
            left = len(state.after) - len(done)
            return waiting, Verdict.APPLIED, f"{at}; waiting on {left} more"


def _release(
    state: JobState,
    event: ParentResolved,
    pos: Position,
    apply: Applier,
    *,
    done: tuple[Resolution, ...],
    at: str,
) -> Step:
    args = released_args(state.args, state.after, done, state.results_to_args)
    if isinstance(args, str):
        gone = apply(state, event, pos, status=Status.CANCELLED, resolutions=done)
        return gone, Verdict.APPLIED, f"{at}: cannot pass the results ({args}), cancelled"
    run_at = max(state.run_at, pos.log_at)
    new = apply(
        state, event, pos, status=Status.SCHEDULED, resolutions=done, args=args, run_at=run_at
    )
    return new, Verdict.APPLIED, f"{at}: rule {state.after_rule} met, released"


def rule_outcome(rule: str, after: tuple[str, ...], done: tuple[Resolution, ...]) -> str:
    """ "release", "give_up" or "wait": what ``rule`` makes of the parents resolved so far."""
    succeeded = sum(r.outcome == Status.SUCCEEDED for r in done)
    complete = len(done) == len(after)
    if rule == ANY_SUCCEEDED:
        return "release" if succeeded else "give_up" if complete else "wait"
    if rule == ALL_FINISHED:
        return "release" if complete else "wait"
    if succeeded < len(done):
        return "give_up"
    return "release" if complete else "wait"


def released_args(
    args: bytes, after: tuple[str, ...], done: tuple[Resolution, ...], placement: str
) -> bytes | str:
    """The child's args with its parents' results placed; a str says why they cannot be."""
    if placement == NONE:
        return args
    outcomes = {r.parent_id: r for r in done}
    try:
        document = json.loads(args)
        results = [_result(outcomes.get(parent)) for parent in after]
        positional = document["args"]
        positional.extend(results if placement == APPEND else [results])
        return json.dumps(
            document, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
        ).encode()
    except (ValueError, TypeError, KeyError, AttributeError, RecursionError) as exc:
        return f"{type(exc).__name__}: {exc}"[:200]


def _result(resolution: Resolution | None) -> Any:
    if resolution is None or resolution.result is None:
        return None
    return json.loads(resolution.result)


def resolutions_to_send(
    before: JobState | None,
    after: JobState | None,
    event: JobEvent,
    verdict: Verdict,
    *,
    pos: Position,
    source: str,
) -> list[ParentResolved]:
    """What the fold of ``event`` must send to children: nothing unless the fold says so."""
    if isinstance(event, ChildRegistered):
        return _answer(before, after, event, verdict, pos=pos, source=source)
    if verdict is not Verdict.APPLIED or after is None or not after.children:
        return []
    if not _ended(after) or (before is not None and _ended(before)):
        return []
    return [_resolution(after, child, after.status, pos, source) for child in after.children]


def _answer(
    before: JobState | None,
    after: JobState | None,
    event: ChildRegistered,
    verdict: Verdict,
    *,
    pos: Position,
    source: str,
) -> list[ParentResolved]:
    """A registration's answer: at once if the parent has ended, is unknown or is full."""
    if bounds.refusal(event) is not None:
        return []
    if verdict is Verdict.APPLIED and after is not None and _ended(after):
        return [_resolution(after, event.child_id, after.status, pos, source)]
    if verdict is Verdict.REJECTED:
        return [_unknown(event, pos, source, before)]
    return []


def _resolution(
    parent: JobState, child: str, outcome: str, pos: Position, source: str
) -> ParentResolved:
    return ParentResolved(
        event_id=resolution_id(pos, child),
        job_id=child,
        emitted_at=pos.log_at,
        source=source,
        parent_id=parent.job_id,
        outcome=outcome,
        parent_partition=pos.partition,
        parent_offset=pos.offset,
        result=parent.result if outcome == Status.SUCCEEDED else None,
        trace=parent.trace,
    )


def _unknown(
    event: ChildRegistered, pos: Position, source: str, parent: JobState | None
) -> ParentResolved:
    return ParentResolved(
        event_id=resolution_id(pos, event.child_id),
        job_id=event.child_id,
        emitted_at=pos.log_at,
        source=source,
        parent_id=event.job_id,
        outcome=UNKNOWN if parent is None else REFUSED,
        parent_partition=pos.partition,
        parent_offset=pos.offset,
        trace=event.trace,
    )


def _ended(state: JobState) -> bool:
    return state.status in TERMINAL_STATUSES
