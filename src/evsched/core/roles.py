"""Who may state each kind of fact on the log, and the fold's rule for facts that need a proof.

Anyone allowed to produce to ``<ns>.events`` can write any kind of event there: a topic ACL cannot
tell one kind from another. So the kinds only a node decides (leases, expiries, fires, purges,
permit steps, a parent's resolution) and those only a leased worker reports (its attempt) must
prove their role: a node's record carries an HMAC by a node key, a worker's an HMAC by the key
of its lease, which only the node that leased it could derive and only the dispatch record
carried (adapters.proofs). The process that folds a record checks that proof and states what it
proved in the record's ``Position``; the fold refuses a fact whose role is not proven.

A partition requires proofs from its first record that carries a valid one on: the history
before it (written before nodes held a key) is judged as it was, so old logs, archives and
replay histories fold as they did, and a forger cannot switch the rule off again.
"""

from __future__ import annotations

from collections.abc import Mapping

from evsched.core.bounds import FIRE_DECISIONS
from evsched.core.events import (
    EVENT_TYPES,
    AttemptCheckpointed,
    AttemptFailed,
    AttemptSnoozed,
    AttemptStarted,
    AttemptSucceeded,
    ChildRegistered,
    Event,
    JobCancelled,
    JobEnqueued,
    JobLeased,
    JobPurged,
    JobRequeued,
    KeyLimitSet,
    LeaseExpired,
    LeaseRenewed,
    ParentResolved,
    PermitGranted,
    PermitRequested,
    Position,
    QueueLimitSet,
    QueuePaused,
    QueuePermit,
    QueueResumed,
    Role,
    ScheduleDeleted,
    ScheduleFired,
    SchedulePaused,
    ScheduleResumed,
    ScheduleUpserted,
)

PRODUCER, NODE, WORKER, OPERATOR = Role.PRODUCER, Role.NODE, Role.WORKER, Role.OPERATOR
_, _, BACKFILLED = FIRE_DECISIONS  # an operator's fire (core.schedule.policy)

# Every kind and the roles that may state it: the one table (docs/security.md shows it).
STATED_BY: Mapping[type[Event], frozenset[Role]] = {
    JobEnqueued: frozenset({PRODUCER, NODE}),  # a node's: the job of a cron fire
    JobCancelled: frozenset({PRODUCER, OPERATOR}),
    JobRequeued: frozenset({PRODUCER, OPERATOR}),
    ChildRegistered: frozenset({PRODUCER}),  # written with the child's enqueue
    JobLeased: frozenset({NODE}),
    LeaseExpired: frozenset({NODE}),
    JobPurged: frozenset({NODE}),
    ParentResolved: frozenset({NODE}),  # the parent's node, when the parent ended
    AttemptStarted: frozenset({WORKER}),
    LeaseRenewed: frozenset({WORKER}),
    AttemptCheckpointed: frozenset({WORKER}),
    AttemptSucceeded: frozenset({WORKER}),
    AttemptFailed: frozenset({WORKER}),
    AttemptSnoozed: frozenset({WORKER}),
    ScheduleUpserted: frozenset({PRODUCER, OPERATOR}),
    ScheduleDeleted: frozenset({PRODUCER, OPERATOR}),
    # A node's fire; an operator's only as a backfill, which the schedule fold judges as one.
    ScheduleFired: frozenset({NODE, OPERATOR}),
    QueuePaused: frozenset({OPERATOR}),
    QueueResumed: frozenset({OPERATOR}),
    SchedulePaused: frozenset({OPERATOR}),
    ScheduleResumed: frozenset({OPERATOR}),
    QueueLimitSet: frozenset({OPERATOR}),
    KeyLimitSet: frozenset({OPERATOR}),
    PermitRequested: frozenset({NODE}),
    PermitGranted: frozenset({NODE}),
    QueuePermit: frozenset({NODE}),
}

# Producers and operators write with the same credentials and prove nothing: a kind that only
# nodes or only workers may state needs that role's proof.
_UNPROVEN_ROLES = frozenset({PRODUCER, OPERATOR})


def _proof_role(roles: frozenset[Role]) -> Role | None:
    if roles & _UNPROVEN_ROLES:
        return None
    (role,) = roles
    return role


# The role whose proof each kind needs (absent: none), read once per folded event. A fire is
# a node's but for an operator's backfill, which ``proof_role`` tells by its decision.
PROOF_ROLE: Mapping[type[Event], Role] = {
    **{cls: role for cls, roles in STATED_BY.items() if (role := _proof_role(roles)) is not None},
    ScheduleFired: NODE,
}
assert set(STATED_BY) == set(EVENT_TYPES), "every kind of event has its roles"

# How a refusal for a missing proof starts: audits tell it from other rejections by it.
UNPROVEN = "unproven"


def proof_role(event: Event) -> Role | None:
    """The role whose proof ``event`` must carry where proofs are required, or None."""
    if isinstance(event, ScheduleFired) and event.decision == BACKFILLED:
        return None  # an operator's backfill: judged by the schedule fold like any other
    return PROOF_ROLE.get(type(event))


def refusal(event: Event, position: Position) -> str | None:
    """Why the fold refuses ``event`` for want of its role's proof, or None."""
    if not position.proofs_required:
        return None
    role = proof_role(event)
    if role is None or position.proven is role:
        return None
    return (
        f"{UNPROVEN}: a {type(event).__name__} is stated by a {role.value} only, "
        f"and this one carries no valid {role.value} proof"
    )


def is_unproven(reason: str) -> bool:
    """Whether a rejection's ``reason`` is ``refusal``'s (a fact refused for want of a proof)."""
    return reason.startswith(UNPROVEN + ":")
