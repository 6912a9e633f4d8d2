"""Deterministic ids: jobs from idempotency keys and cron fires, event ids of node decisions,
of a namespace migration's moves and of the workflow resolutions a record's fold sends."""

from __future__ import annotations

import hashlib
import uuid

from evsched.core.events import JobTemplate, Position

# Fixed namespace so every producer, in any language, derives the same ids (UUIDv5, RFC 9562).
EVSCHED_NAMESPACE = uuid.UUID("6f1c1c3e-6b0e-5d8a-9a57-2f0a3d7c9e41")
# The namespace of the resolutions' ids (ParentResolved): a refold makes the same ones.
RESOLUTION_NAMESPACE = uuid.UUID("6f1c3a52-8e0b-4d7e-9a43-0c5b7d2e9f10")


def job_id_for_key(queue: str, idempotency_key: str) -> str:
    """The job id of a keyed enqueue: duplicates from any producer land on one job and partition."""
    return str(uuid.uuid5(EVSCHED_NAMESPACE, f"job\x00{queue}\x00{idempotency_key}"))


def job_id_for_unique(queue: str, task: str, args: bytes) -> str:
    """The job id of a unique enqueue without a key: the same task, queue and args make one id."""
    return str(uuid.uuid5(EVSCHED_NAMESPACE, f"unique\x00{body_digest(task, queue, args).hex()}"))


def job_id_for_runs(schedule_id: str) -> str:
    """The one job id of every fire of a schedule with an overlap policy: one run at a time."""
    return str(uuid.uuid5(EVSCHED_NAMESPACE, f"runs\x00{schedule_id}"))


def job_id_for_fire(schedule_id: str, fire_at: int) -> str:
    """The job id of one cron slot, so two nodes firing the same slot make one job."""
    return str(uuid.uuid5(EVSCHED_NAMESPACE, f"cron\x00{schedule_id}\x00{fire_at}"))


def fire_idempotency_key(schedule_id: str, fire_at: int) -> str:
    return f"cron:{schedule_id}@{fire_at}"


def decision_event_id(entity_id: str, decision: str, number: int) -> str:
    """Event id of a node decision: re-emitting the same decision after a crash is a duplicate."""
    return str(uuid.uuid5(EVSCHED_NAMESPACE, f"decision\x00{entity_id}\x00{decision}\x00{number}"))


def moved_event_id(*parts: object) -> str:
    """Event id of one event of a namespace migration, from what it does and the run it moves:
    a repeated or resumed migration writes the same ids again, which the fold calls duplicates."""
    return str(uuid.uuid5(EVSCHED_NAMESPACE, "moved\x00" + "\x00".join(str(p) for p in parts)))


def resolution_id(pos: Position, child: str) -> str:
    """Event id of the ParentResolved the record at ``pos`` sends ``child``: one per record."""
    return str(uuid.uuid5(RESOLUTION_NAMESPACE, f"{pos.partition}:{pos.offset}:{child}"))


def body_digest(task: str, queue: str, args: bytes) -> bytes:
    """Digest of what makes two enqueues "the same job"; the fold never takes a producer's."""
    h = hashlib.sha256()
    for part in (task.encode(), queue.encode(), args):
        h.update(len(part).to_bytes(8, "big"))
        h.update(part)
    return h.digest()


def template_digest(template: JobTemplate) -> bytes:
    return body_digest(template.task, template.queue, template.args)
