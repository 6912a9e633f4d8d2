"""Key layout of the RocksDB index: times and ids encoded so byte order is the order read in.

See projections/README.md for every column family's keys.
"""

from __future__ import annotations

import struct
from typing import assert_never

from evsched.core.events import EventTimeline
from evsched.core.routing import timeline_of_kind
from evsched.core.state import JobState

JOBS, DUE, LEASES, TIMELINE, KEYS = "jobs", "due", "leases", "timeline", "keys"
# Finished jobs by purge time; the purge entries kept for audits, by the time they expire.
PURGES, MARKS = "purges", "purge_marks"
# Rejected events of jobs the index does not hold (adapters.index.orphans): their own marks, by
# the time they expire, and the ones that follow a kept purge mark, by job id.
ORPHANS, FOLLOWERS = "orphans", "purge_followers"
# Records that did not decode, and events refused for an id that cannot key a timeline, by
# offset; each keeps only its newest records (adapters.index.poison).
UNDECODABLE, REFUSED = "undecodable", "refused"
# The earlier runs of reused ids (adapters.index.runs): per job, each kept run's start and the
# state a refold of it starts from; and by the time each run leaves, the next run's start.
RUNS, RUN_MARKS = "runs", "run_marks"
U64 = struct.Struct(">Q")

# A job, a schedule and a queue may share an id: their timelines live under different first bytes.
JOB_TIMELINE, SCHEDULE_TIMELINE, QUEUE_TIMELINE = b"j", b"s", b"q"
# A limit's permit steps (``QueuePermit``: request, grant, release at its home), keyed by the
# limit's name. Not on the queue timeline (fold version 7): a busy limit's home makes millions
# of them a week, and the readers of pauses and settings (time travel, ``--wait``) scan that one.
PERMIT_TIMELINE = b"p"


def timeline_family(kind: str) -> bytes:
    """Under which first byte a timeline entry of event ``kind`` is keyed (job, schedule, queue,
    a limit's permit steps): its event class's ``timeline`` (core.routing)."""
    timeline = timeline_of_kind(kind)
    match timeline:
        case EventTimeline.JOB:
            return JOB_TIMELINE
        case EventTimeline.SCHEDULE:
            return SCHEDULE_TIMELINE
        case EventTimeline.QUEUE:
            # A queue's pauses and its limits' settings (core.permits: a key's limit sits there).
            return QUEUE_TIMELINE
        case EventTimeline.PERMIT:
            return PERMIT_TIMELINE
        case _:
            assert_never(timeline)


def _id(value: str) -> bytes:
    """A length-prefixed id, so ids of any content sort and prefix-scan unambiguously.

    Only ids within the fold's limit (``limits.MAX_ID_BYTES``) are keyed: the 2 bytes hold them.
    """
    raw = value.encode()
    return struct.pack(">H", len(raw)) + raw


def time_key(at: int, entity: str) -> bytes:
    return U64.pack(max(0, at)) + entity.encode()


def timeline_key(
    entity_id: str, offset: int, *, schedule: bool = False, family: bytes | None = None
) -> bytes:
    if family is None:
        family = SCHEDULE_TIMELINE if schedule else JOB_TIMELINE
    return family + _id(entity_id) + U64.pack(offset)


def runs_key(job_id: str, boundary: int) -> bytes:
    """A ``runs`` key: the job id, length-prefixed, then the offset where a run of it began."""
    return _id(job_id) + U64.pack(boundary)


def prefix_end(prefix: bytes) -> bytes:
    """The smallest key greater than every key starting with ``prefix``."""
    trimmed = prefix.rstrip(b"\xff")
    return trimmed[:-1] + bytes([trimmed[-1] + 1]) if trimmed else b"\xff" * (len(prefix) + 1)


def keys_key(state: JobState) -> bytes:
    """The ``keys`` entry of a keyed job: queue, a NUL, the idempotency key."""
    return state.queue.encode() + b"\x00" + (state.idempotency_key or "").encode()


def job_timeline_prefix(job_id: bytes) -> bytes:
    """The ``timeline`` keys of one job's entries all start with this (``job_id`` as UTF-8)."""
    return JOB_TIMELINE + struct.pack(">H", len(job_id)) + job_id


def timeline_job(key: bytes) -> bytes | None:
    """The job id (UTF-8) a ``timeline`` key is an entry of; None for another entity's entry."""
    if not key.startswith(JOB_TIMELINE) or len(key) < 3:
        return None
    size = int.from_bytes(key[1:3], "big")
    return key[3 : 3 + size]
