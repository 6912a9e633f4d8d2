"""``evsched namespace migrate`` on the real broker (issue 12, item 4): a namespace's live jobs and
schedules carried into a namespace with more events partitions, exactly once, while a running
job finishes where it runs; the old namespace's audit says where each job went."""

from __future__ import annotations

from collections import Counter
from datetime import timedelta
from pathlib import Path

import pytest
from tests.conftest import unique_name
from tests.integration.engine import Operator, Stack, all_succeeded, wait_for

from evsched.adapters.kafka.topics import ensure_topics, partition_count
from evsched.core.events import Event, JobEnqueued, Position
from evsched.core.state import Status, Verdict

pytestmark = [pytest.mark.broker, pytest.mark.slow, pytest.mark.timeout(600)]
DEADLINE_S = 120.0


def enqueue_counts(history: list[tuple[Event, Position]]) -> Counter[str]:
    """How many JobEnqueued each job has in ``history``, whatever their verdicts."""
    return Counter(e.job_id for e, _ in history if isinstance(e, JobEnqueued))


async def test_live_jobs_and_schedules_move_once_and_running_ones_finish_in_place(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    old = Stack(kafka_bootstrap, unique_name("mig"), tmp_path / "old", partitions=2)
    new = Stack(kafka_bootstrap, unique_name("big"), tmp_path / "new", partitions=4)
    (tmp_path / "old").mkdir()
    (tmp_path / "new").mkdir()
    marks = tmp_path / "marks"
    marks.mkdir()
    await ensure_topics(kafka_bootstrap, old.namespace, event_partitions=2, queues=["default"])
    operator = Operator(old)
    old.start_node("node-1")
    old.start_worker("worker-1")
    try:
        async with old.app() as app:
            running = await app.enqueue("s.gated", str(marks), "running")
            await old.wait_status(running, Status.RUNNING)
            code, output = await operator.run("queues", "pause", "default")
            assert code == 0, output
            due = [await app.enqueue("s.effect", f"due-{i}") for i in range(6)]
            later = app.get_task("s.noop").options(delay=timedelta(hours=1))
            delayed = [await later.enqueue() for _ in range(3)]
        code, output = await operator.run(
            "schedules", "upsert", "nightly", "0 3 * * *", "s.noop", "[]"
        )
        assert code == 0, output
        for job in due + delayed:
            await old.wait_status(job, Status.SCHEDULED)

        migrate = ("namespace", "migrate", "--to", new.namespace)
        first = await operator.json(*migrate, "--partitions", "4")
        assert (first["jobs"], first["schedules"], first["left"]) == (9, 1, {"running": 1})
        assert await partition_count(kafka_bootstrap, new.topics.events) == 4
        (marks / "go").touch()  # the running job finishes in the old namespace
        await old.wait_status(running, Status.SUCCEEDED)
        again = await operator.json(*migrate)
        assert (again["jobs"], again["schedules"], again["left"]) == (0, 0, {})

        for job in due + delayed:
            state = await old.wait_status(job, Status.CANCELLED)
            assert state.token == 0  # never leased in the old namespace
        code, output = await operator.run("audit", due[0])
        assert code == 0 and f"moved to namespace {new.namespace}" in output, output

        new.start_node("node-1")
        new.start_worker("worker-1")

        async def due_ran() -> bool:
            return await all_succeeded(new, due)

        await wait_for(due_ran, what="the carried due jobs to run", timeout_s=DEADLINE_S)
        for job in delayed:
            state = await new.wait_status(job, Status.SCHEDULED)
            assert state.run_at > state.enqueued_at  # still delayed, not run early
        folded = await new.check(all_terminal=False)
        events, _ = await new.history()
        assert enqueue_counts(events) == Counter({j: 1 for j in due + delayed})
        assert running not in folded.jobs
        for job in due + delayed:
            enqueues = [e for e in folded.job_timelines[job] if e.kind == "JobEnqueued"]
            assert [e.verdict for e in enqueues] == [Verdict.APPLIED]
        replica = await new.replica()

        async def schedule_live() -> bool:
            state = replica.index(replica.partition_of("nightly")).schedule("nightly")
            return state is not None and not state.deleted

        await wait_for(schedule_live, what="the schedule in the new namespace")
    finally:
        await new.close()
        await old.close()
