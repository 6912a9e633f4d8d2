"""The lifetime tallies of a partition: what one judged event adds to its retries, dead letters...

``tallied`` is the one counting rule. The index keeps its counts per partition, written in the
same batch as the applied offset (so a rebuild and a changelog restore reproduce them), and
observers of the fold (the dashboard, the metrics) ask the same question of the same verdicts.
"""

from __future__ import annotations

from evsched.core import roles
from evsched.core.state import FoldedEvent, JobState, Status, Verdict

RETRIES = "retries"  # an accepted failure that put the job back to scheduled for another try
DEAD_LETTERS = "dead_letters"  # a job entering dead
STALE_COMPLETIONS = "stale_completions"  # a success or failure judged stale (a zombie's)
LEASE_EXPIRATIONS = "lease_expirations"  # an accepted LeaseExpired
SUCCEEDED = "succeeded"  # an accepted AttemptSucceeded
CANCELLED = "cancelled"  # a job entering cancelled
UNDECODABLE = "undecodable"  # a record that did not decode
UNPROVEN = "unproven"  # a node's or worker's fact refused for want of its proof (core.roles)
# Not a count but a switch: 1 once the partition requires proofs (adapters.proofs).
PROOFS_REQUIRED = "proofs_required"

# Every tally, in the order the overview shows them.
NAMES = (
    RETRIES, DEAD_LETTERS, STALE_COMPLETIONS, LEASE_EXPIRATIONS, SUCCEEDED, CANCELLED, UNDECODABLE,
    UNPROVEN,
)  # fmt: skip
COMPLETIONS = frozenset({"AttemptSucceeded", "AttemptFailed"})
# Reports that may spend the attempt: a failure, or a snooze past the task's cap (core.snooze).
_ATTEMPT_ENDS = frozenset({"AttemptFailed", "AttemptSnoozed"})
_NONE: tuple[str, ...] = ()


def tallied(folded: FoldedEvent) -> tuple[str, ...]:
    """The tallies ``folded`` adds one to (most events: none)."""
    entry = folded.entry
    if entry.verdict is Verdict.UNDECODABLE:
        return (UNDECODABLE,)
    if entry.verdict is Verdict.STALE:
        return (STALE_COMPLETIONS,) if entry.kind in COMPLETIONS else _NONE
    if entry.verdict is Verdict.REJECTED and roles.is_unproven(entry.reason):
        return (UNPROVEN,)
    after = folded.after
    if entry.verdict is not Verdict.APPLIED or after is None:
        return _NONE  # refused, or a purge (which lowers no tally)
    before = folded.before
    found: list[str] = []
    if entry.kind == "AttemptSucceeded":
        found.append(SUCCEEDED)
    elif entry.kind in _ATTEMPT_ENDS and after.snoozed_until is None and _retried(before, after):
        found.append(RETRIES)
    elif entry.kind == "LeaseExpired":
        found.append(LEASE_EXPIRATIONS)
    if _entered(Status.DEAD, before, after):
        found.append(DEAD_LETTERS)
    elif _entered(Status.CANCELLED, before, after):
        found.append(CANCELLED)
    return tuple(found)


def _retried(before: JobState | None, after: JobState) -> bool:
    # The same run tries again; a failure that ends the run and starts a held one (core.unique)
    # is no retry.
    return (
        after.status is Status.SCHEDULED
        and before is not None
        and before.generation == after.generation
    )


def _entered(status: Status, before: JobState | None, after: JobState) -> bool:
    return after.status is status and (before is None or before.status is not status)
