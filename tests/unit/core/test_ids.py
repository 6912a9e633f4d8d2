"""Deterministic ids: the same inputs give the same id on every machine and in every language."""

from __future__ import annotations

import uuid

from evsched.core import ids
from evsched.core.events import JobEnqueued, JobTemplate, Position
from evsched.core.fold import fold


def test_job_id_for_key_is_a_pinned_uuid5() -> None:
    job_id = ids.job_id_for_key("mail", "order-42")
    # Pinned: producers in other languages compute the same value from the documented recipe.
    assert job_id == "03055f32-7d7f-5dc7-b4dc-af5eb83d22f1"
    assert job_id == str(uuid.uuid5(ids.EVSCHED_NAMESPACE, "job\x00mail\x00order-42"))
    assert uuid.UUID(job_id).version == 5


def test_job_id_for_key_depends_on_queue_and_key_without_ambiguity() -> None:
    assert ids.job_id_for_key("mail", "order-42") == ids.job_id_for_key("mail", "order-42")
    assert ids.job_id_for_key("mail", "order-42") != ids.job_id_for_key("sms", "order-42")
    assert ids.job_id_for_key("mail", "order-42") != ids.job_id_for_key("mail", "order-43")
    assert ids.job_id_for_key("ab", "c") != ids.job_id_for_key("a", "bc")


def test_job_id_for_fire_is_a_pinned_uuid5_per_schedule_and_slot() -> None:
    job_id = ids.job_id_for_fire("nightly", 1_743_381_000_000)
    assert job_id == "2391fc30-81c9-595b-b3ec-944aaa801689"
    assert job_id == ids.job_id_for_fire("nightly", 1_743_381_000_000)
    assert job_id != ids.job_id_for_fire("nightly", 1_743_381_000_001)
    assert job_id != ids.job_id_for_fire("hourly", 1_743_381_000_000)
    # A cron job's id never collides with a keyed job's id for look-alike inputs.
    assert job_id != ids.job_id_for_key("nightly", "1743381000000")


def test_fire_idempotency_key_names_schedule_and_slot() -> None:
    assert ids.fire_idempotency_key("nightly", 5) == "cron:nightly@5"


def test_decision_event_id_is_stable_so_a_replayed_decision_is_a_duplicate() -> None:
    first = ids.decision_event_id("job-1", "lease", 3)
    assert first == "18371c0c-e9e2-57c8-a1f5-f88ac0ef349d"
    assert first == ids.decision_event_id("job-1", "lease", 3)
    assert first != ids.decision_event_id("job-1", "lease", 4)
    assert first != ids.decision_event_id("job-1", "expire", 3)
    assert first != ids.decision_event_id("job-2", "lease", 3)


def test_a_migrations_event_ids_are_stable_per_move_and_run() -> None:
    # The recipe the migration has always used: a repeated migration writes the same ids again.
    first = ids.moved_event_id("enqueued", "job-1", 0)
    assert first == str(uuid.uuid5(ids.EVSCHED_NAMESPACE, "moved\x00enqueued\x00job-1\x000"))
    assert first == ids.moved_event_id("enqueued", "job-1", 0)
    assert first != ids.moved_event_id("cancelled", "job-1", 0)
    assert first != ids.moved_event_id("enqueued", "job-1", 1)


def test_a_resolutions_id_is_stable_per_record_and_child() -> None:
    pos = Position(partition=2, offset=41, log_at=7)
    first = ids.resolution_id(pos, "child-1")
    namespace = uuid.UUID("6f1c3a52-8e0b-4d7e-9a43-0c5b7d2e9f10")
    assert first == str(uuid.uuid5(namespace, "2:41:child-1"))
    assert first == ids.resolution_id(Position(partition=2, offset=41, log_at=99), "child-1")
    assert first != ids.resolution_id(pos, "child-2")
    assert first != ids.resolution_id(Position(partition=2, offset=42, log_at=7), "child-1")


def test_body_digest_is_length_prefixed_so_fields_cannot_shift() -> None:
    assert ids.body_digest("ab", "c", b"") != ids.body_digest("a", "bc", b"")
    assert ids.body_digest("t", "q", b"x") == ids.body_digest("t", "q", b"x")
    assert len(ids.body_digest("t", "q", b"x")) == 32


def _enqueue(**over: object) -> JobEnqueued:
    fields: dict[str, object] = {
        "event_id": "e",
        "job_id": "j",
        "emitted_at": 0,
        "source": "s",
        "task": "t",
        "queue": "q",
        "args": b"{}",
    } | over
    return JobEnqueued(**fields)  # type: ignore[arg-type]


def test_the_fold_digest_ignores_the_producer_digest_and_fields_outside_the_body() -> None:
    def digest(event: JobEnqueued) -> bytes:
        state, _ = fold(None, event, Position(partition=0, offset=0, log_at=0))
        assert state is not None
        return state.body_digest

    assert digest(_enqueue(body_digest=b"given")) == ids.body_digest("t", "q", b"{}")
    assert digest(_enqueue(priority=9, labels={"a": "b"})) == digest(_enqueue())


def test_template_digest_matches_the_body_digest_of_its_jobs() -> None:
    template = JobTemplate(task="t", queue="q", args=b"{}")
    assert ids.template_digest(template) == ids.body_digest("t", "q", b"{}")
