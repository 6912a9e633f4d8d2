"""Retention and idempotency-key windows: when a finished job may be purged or its key reused.

Both windows count log time (the broker's append time) from the moment the job ended, which is its
``updated_at`` once terminal: nothing but a requeue, a new run or a purge applies to a finished job.
A job carries the windows its enqueue asked for; None means the defaults here, so every replica and
replay reaches the same decision from the log alone. See docs/job-lifecycle.md, "Retention".
"""

from __future__ import annotations

from dataclasses import dataclass

from evsched.core.state import TERMINAL_STATUSES, JobState

DAY_MS = 86_400_000
DEFAULT_RETENTION_MS = 7 * DAY_MS
DEFAULT_KEY_WINDOW_MS = DAY_MS
# How long the index keeps a timeline entry of an entity that is never purged: a rejected event
# of a job it does not hold (a forged id, or a late event of a purged job once the purge's own
# mark is gone; fold version 6), a rejected event of a schedule it does not hold, and every
# permit step (``QueuePermit``) of a limit, whatever its verdict (fold version 7). The default
# retention, so such entries expire like purge marks, from the log alone: a namespace's own
# retention is not on the log for an unknown job, nor for a schedule or a limit.
ORPHAN_KEPT_MS = DEFAULT_RETENTION_MS


def retention_ms(state: JobState) -> int:
    return DEFAULT_RETENTION_MS if state.retention_ms is None else state.retention_ms


def key_window_ms(state: JobState) -> int:
    return DEFAULT_KEY_WINDOW_MS if state.key_window_ms is None else state.key_window_ms


def purge_at(state: JobState) -> int | None:
    """The log time from which ``state`` may be purged, or None while the job is not finished."""
    if state.status not in TERMINAL_STATUSES:
        return None
    return state.updated_at + retention_ms(state)


def key_window_passed(state: JobState, log_at: int) -> bool:
    """Whether an enqueue at ``log_at`` starts a new run of this keyed, finished job."""
    if state.idempotency_key is None or state.status not in TERMINAL_STATUSES:
        return False
    return log_at >= state.updated_at + key_window_ms(state)


def purge_refusal(state: JobState, generation: int, log_at: int) -> str | None:
    """Why a purge of run ``generation`` at ``log_at`` must be rejected, or None."""
    if generation != state.generation:
        return f"cannot purge run {generation}: the job is at run {state.generation}"
    due = purge_at(state)
    if due is None:
        return f"cannot purge: job is {state.status}"
    if log_at < due:
        return f"cannot purge before its retention ends at {due} (log time {log_at})"
    return None


def purge_reason(state: JobState, partition: int) -> str:
    """The audit's reading of an applied purge: what ended and where the history still is."""
    return (
        f"purged {state.status} run {state.generation} after {retention_ms(state)} ms of "
        f"retention; its history is on the events log from partition {partition} offset "
        f"{state.first_offset}, or in an archive of it"
    )


def mark_until(state: JobState, log_at: int) -> int:
    """Until when the purge's own timeline entry stays in the index, for audits.

    As long as the job was kept: the index then holds at most two retention periods of finished
    runs, whatever the age of the deployment (an earlier run of a reused id goes on its own, at
    ``EndedRun.kept_until``).
    """
    return log_at + retention_ms(state)


@dataclass(frozen=True, slots=True, kw_only=True)
class EndedRun:
    """An earlier run of a reused id, ended as the next one began (a key window passed, a
    ``unique`` scope, a schedule's overlap policy).

    The job's timeline entries below ``boundary`` are that run's (and any before it); they leave
    the index at log time ``kept_until``, its end plus its retention, while the id lives on.
    ``base`` is the job's state just before ``boundary``: what a refold of the runs still kept
    (an audit, time travel) starts from once the earlier ones are gone.
    """

    boundary: int
    kept_until: int
    base: JobState


def ended_run(
    before: JobState | None, after: JobState | None, offset: int, log_at: int
) -> EndedRun | None:
    """The run that the applied event at ``offset`` (log time ``log_at``) ended for a new run of
    the same id, or None when it began no new run."""
    if before is None or after is None or after.generation == before.generation:
        return None
    if before.status in TERMINAL_STATUSES:
        # An enqueue began the new run: it is the new run's first entry.
        kept_until = before.updated_at + retention_ms(before)
        return EndedRun(boundary=offset, kept_until=kept_until, base=before)
    # The event ended the run and began the one held for it (core.unique.next_run): it is the
    # ended run's last entry.
    return EndedRun(boundary=offset + 1, kept_until=log_at + retention_ms(before), base=after)


def orphan_until(log_at: int) -> int:
    """Until when the index keeps an entry at ``log_at`` of an entity that is never purged.

    These are: a rejected event of a job or of a schedule the index does not hold, and a limit's
    permit step (``QueuePermit``) of any verdict; a limit's settings (``QueueLimitSet``,
    ``KeyLimitSet``) and a queue's pauses stay. A late event of a purged job whose purge mark is
    still kept goes with that mark instead (``adapters.index.orphans``).
    """
    return log_at + ORPHAN_KEPT_MS
