"""The runs ``replay/record.py`` records: real node and worker processes driven like in production.

Each function gets a fresh ``Stack`` (one namespace on the broker) and returns once every job it
started has reached the status the scenario wants; the recorder then checks and exports the log.
"""

from __future__ import annotations

import signal
import struct
from dataclasses import replace

from tests.integration.engine import Proc, Stack, wait_for, wait_path

from evsched.adapters import avro
from evsched.adapters.kafka import clients as kafka
from evsched.adapters.payload import encode_args
from evsched.client import App
from evsched.core import ids
from evsched.core.events import (
    Event,
    JobEnqueued,
    JobLeased,
    JobPurged,
    JobTemplate,
    ScheduleDeleted,
    ScheduleFired,
    ScheduleUpserted,
    entity_id,
)
from evsched.core.state import TERMINAL_STATUSES, JobState, Status, TimelineEntry

GARBAGE = (
    b"not avro at all",
    b"\xc3\x01" + b"\x00" * 8 + b"\x02",  # the magic, an unknown writer fingerprint
    b"\xc3\x01\x12",  # the magic and a truncated header
    b"",
    bytes(range(256)),
)


async def until_status(stack: Stack, job_ids: list[str], *wanted: Status) -> None:
    """Until every job in ``job_ids`` has one of ``wanted`` (any terminal status by default)."""
    statuses = set(wanted) or set(TERMINAL_STATUSES)

    async def there() -> bool:
        for job_id in job_ids:
            state = await stack.job(job_id)
            if state is None or state.status not in statuses:
                return False
        return True

    await wait_for(there, what=f"{len(job_ids)} jobs to be {sorted(statuses)}", timeout_s=240)


async def until_rerun(stack: Stack, job_ids: list[str]) -> None:
    """Until every requeued job in ``job_ids`` has run again to a terminal status."""

    async def rerun() -> bool:
        for job_id in job_ids:
            timeline = await stack.timeline(job_id)
            requeued = [e.offset for e in timeline if e.kind == "JobRequeued"]
            ended = [e.offset for e in timeline if e.status_after in TERMINAL_STATUSES]
            if not requeued or not ended or ended[-1] < requeued[-1]:
                return False
        return True

    await wait_for(rerun, what=f"{len(job_ids)} requeued jobs to run again", timeout_s=240)


async def enqueue_many(app: App, task: str, count: int, *args: object) -> list[str]:
    return [await app.enqueue(task, *args) for _ in range(count)]


async def produce_raw(stack: Stack, records: list[tuple[bytes, bytes]]) -> None:
    """Write (key, value) records to the events topic as they are: garbage, or repeated bytes."""
    producer = kafka.producer(stack.settings, client_id="corpus-raw")
    await producer.start()
    try:
        for key, value in records:
            await producer.send_and_wait(stack.topics.events, value, key=key)
    finally:
        await producer.stop()


async def lifecycle(stack: Stack) -> None:
    stack.start_node("node-1", "--dispatch-timeout-s", "10")
    for name in ("worker-1", "worker-2"):
        stack.start_worker(name, "--lease-s", "3", "--concurrency", "16")
    async with stack.app() as app:
        done = await _plain_jobs(app)
        delayed = await _cancels_and_requeues(app)
        done += await _idempotency(app)
        running = await _cancel_running(stack, app)
        await until_status(stack, done + running + delayed[:10])
        dead = [j for j in done if (s := await stack.job(j)) and s.status is Status.DEAD]
        for job_id in dead[:20]:
            await app.requeue(job_id, reason="after the fix")
        await app.requeue(done[0])  # a succeeded job: rejected
        await app.cancel("no-such-job")  # unknown: rejected
        await until_rerun(stack, dead[:20])
    await _repeats_and_garbage(stack, done[:3])


async def _plain_jobs(app: App) -> list[str]:
    """Successes with effects, retries, permanent and exhausted failures."""
    jobs = [await app.enqueue("s.effect", f"tag-{i}") for i in range(1_500)]
    jobs += await enqueue_many(app, "s.noop", 300)
    for failures in (0, 1, 2, 3, 9):  # 9: more failures than the four attempts allowed
        jobs += await enqueue_many(app, "s.flaky", 12, failures)
    jobs += await enqueue_many(app, "s.permanent", 20)
    jobs += await enqueue_many(app, "s.always_fail", 20)
    return jobs


async def _cancels_and_requeues(app: App) -> list[str]:
    """Delayed jobs: most cancelled while scheduled, some of those requeued to run now."""
    delayed_task = app.get_task("s.noop").options(delay=3_600)
    delayed = [await delayed_task.enqueue() for _ in range(40)]
    for job_id in delayed[:30]:
        await app.cancel(job_id, reason="not needed")
    for job_id in delayed[:5]:
        await app.cancel(job_id)  # already cancelled: rejected
    for job_id in delayed[:10]:
        await app.requeue(job_id, reason="needed after all")
    return delayed


async def _idempotency(app: App) -> list[str]:
    """Keyed enqueues, each repeated with the same body; some reused with another body."""
    keyed = app.get_task("s.effect")
    jobs = [await keyed.options(idempotency_key=f"order-{i}").enqueue(f"k{i}") for i in range(40)]
    for i in range(40):
        await keyed.options(idempotency_key=f"order-{i}").enqueue(f"k{i}")  # duplicate
    for i in range(15):
        await keyed.options(idempotency_key=f"order-{i}").enqueue(f"other-{i}")  # conflict
    return jobs


async def _cancel_running(stack: Stack, app: App) -> list[str]:
    """Jobs cancelled while their handler runs; the handler's completion then comes in late."""
    folders = [stack.tmp / f"gated-{i}" for i in range(4)]
    jobs = []
    for i, folder in enumerate(folders):
        folder.mkdir()
        jobs.append(await app.enqueue("s.gated", str(folder), f"g{i}"))
    for job_id, folder in zip(jobs, folders, strict=True):
        await wait_path(folder / "started-1-1")
        await app.cancel(job_id, reason="operator stop")
        await until_status(stack, [job_id], Status.CANCELLED)
        (folder / "go").touch()
        await _completion_folded(stack, job_id)
    return jobs


async def _completion_folded(stack: Stack, job_id: str) -> None:
    """Until the cancelled attempt's report (its success, or the follow's cancelled failure) is
    folded: since fold version 3 a worker's follow cancels the handler."""

    async def folded() -> bool:
        kinds = {e.kind for e in await stack.timeline(job_id)}
        return bool(kinds & {"AttemptSucceeded", "AttemptFailed"})

    await wait_for(folded, what=f"the late completion of {job_id}", timeout_s=120)


async def _repeats_and_garbage(stack: Stack, job_ids: list[str]) -> None:
    """Producer retries (the same bytes again) of a few events, and undecodable records."""
    wanted = {job_id.encode() for job_id in job_ids}
    records = [r for r in await stack.read_topic(stack.topics.events) if r.key in wanted]
    repeats = [(r.key or b"", r.value or b"") for r in records[:6]]
    await produce_raw(stack, repeats + [(b"garbage", blob) for blob in GARBAGE])
    end = await stack.read_topic(stack.topics.events)
    for partition in range(stack.partitions):
        offsets = [r.offset for r in end if r.partition == partition]
        if offsets:
            await stack.wait_node_past(partition, max(offsets))


def _pid(worker_id: str | None) -> int:
    assert worker_id is not None
    return int(worker_id.rsplit("-", 2)[1])


async def _running_on(stack: Stack, job_id: str, procs: list[Proc]) -> tuple[JobState, Proc]:
    async def probe() -> tuple[JobState, Proc] | None:
        state = await stack.job(job_id)
        if state is None or state.status is not Status.RUNNING:
            return None
        found = [p for p in procs if p.pid == _pid(state.worker_id) and p.popen.poll() is None]
        return (state, found[0]) if found else None

    return await wait_for(probe, what=f"job {job_id} running", timeout_s=90)


async def workers(stack: Stack) -> None:
    stack.start_node("node-1", "--dispatch-timeout-s", "15")
    a = stack.start_worker("worker-a", "--lease-s", "2")
    async with stack.app() as app:
        b = await _stale_while_rerun_runs(stack, app, a)
        await _stale_after_rerun_committed(stack, app, [a, b])
        await _killed_resumes_from_checkpoint(stack, app, [a, b])


async def _stale_while_rerun_runs(stack: Stack, app: App, a: Proc) -> Proc:
    marks = stack.tmp / "frozen-1"
    marks.mkdir()
    job_id = await app.enqueue("s.gated_each", str(marks), "frozen")
    await wait_path(marks / "started-1-1")
    a.signal(signal.SIGSTOP)
    b = stack.start_worker("worker-b", "--lease-s", "2")
    rerun, _ = await _running_on(stack, job_id, [b])
    a.signal(signal.SIGCONT)
    (marks / "go-1").touch()
    await wait_path(marks / "finished-1-1")
    (marks / f"go-{rerun.token}").touch()
    await until_status(stack, [job_id], Status.SUCCEEDED)
    return b


async def _stale_after_rerun_committed(stack: Stack, app: App, procs: list[Proc]) -> None:
    marks = stack.tmp / "frozen-2"
    marks.mkdir()
    job_id = await app.enqueue("s.gated", str(marks), "late")
    _, first = await _running_on(stack, job_id, procs)
    await wait_path(marks / "started-1-1")
    first.signal(signal.SIGSTOP)
    others = [p for p in procs if p is not first]
    await _running_on(stack, job_id, others)
    (marks / "go").touch()
    await until_status(stack, [job_id], Status.SUCCEEDED)
    first.signal(signal.SIGCONT)  # its handler sees `go` and completes token 1: stale
    await wait_path(marks / "finished-1-1")


async def _killed_resumes_from_checkpoint(stack: Stack, app: App, procs: list[Proc]) -> None:
    marks = stack.tmp / "count"
    marks.mkdir()
    job_id = await app.enqueue("s.count", str(marks), 8)
    _, runner = await _running_on(stack, job_id, procs)
    await wait_path(marks / "a1-s3")
    runner.kill()
    stack.start_worker("worker-c", "--lease-s", "2")
    await until_status(stack, [job_id], Status.SUCCEEDED)


async def cron_two_nodes(stack: Stack) -> None:
    first = stack.start_node("node-1")
    second = stack.start_node("node-2")
    stack.start_worker("worker-1", "--lease-s", "3")
    for node in (first, second):
        await wait_for(lambda n=node: _logged(n, "partition_assigned"), what=f"{node.name} up")
    async with stack.app() as app:
        await app.upsert_schedule("every-2s", "* * * * * */3", "UTC", "s.noop")
        await app.upsert_schedule("every-2s", "* * * * * */2", "UTC", "s.noop")  # replaced
        await app.upsert_schedule("nightly", "0 3 * * *", "Europe/Paris", "s.effect", args=["n"])
        await _fires(stack, 2)
        second.kill()  # the schedule's owner may change mid-way
        await _fires(stack, 5)
        await app.delete_schedule("every-2s")
        await app.delete_schedule("never-made")  # unknown: rejected
    replica = await stack.replica()

    async def deletion() -> TimelineEntry | None:
        found = [e for e in replica.timeline("every-2s") if e.kind == "ScheduleDeleted"]
        return found[0] if found else None

    entry = await wait_for(deletion, what="the deletion to be folded")
    await stack.wait_node_past(entry.partition, entry.offset)  # no slot fires after this
    events, _ = await stack.history()
    fired = sorted({e.job_id for e, _ in events if isinstance(e, JobEnqueued) and e.schedule_id})
    await until_status(stack, fired)


async def _fires(stack: Stack, minimum: int) -> None:
    async def enough() -> bool:
        events, _ = await stack.history()
        slots = {e.fire_at for e, _ in events if isinstance(e, ScheduleFired)}
        return len(slots) >= minimum

    await wait_for(enough, what=f"{minimum} cron slots to fire", timeout_s=60)


async def _logged(proc: Proc, event: str) -> bool:
    return f'"event": "{event}"' in proc.log()


async def hardening(stack: Stack) -> None:
    """Issue 9's fold rules on a real run: limits, random cron, forged digests, unstarted leases."""
    stack.start_node("node-1", "--dispatch-timeout-s", "2")
    async with stack.app() as app:
        unstarted = await app.enqueue("s.noop")  # no worker yet: its leases expire unstarted
        await _until_applied(stack, unstarted, "LeaseExpired", 4)  # more than its 3 attempts
        victim_task = app.get_task("s.effect").options(idempotency_key="victim", delay=3_600)
        victim = await victim_task.enqueue("mine")
        await produce_raw(stack, _forged(victim))
        stack.start_worker("worker-1", "--lease-s", "3")
        await until_status(stack, [unstarted], Status.SUCCEEDED)
    await until_node_past_the_end(stack)


async def _until_applied(stack: Stack, job_id: str, kind: str, count: int) -> None:
    async def enough() -> bool:
        timeline = await stack.timeline(job_id)
        return sum(e.kind == kind and e.verdict.value == "applied" for e in timeline) >= count

    await wait_for(enough, what=f"{count} applied {kind} of {job_id}", timeout_s=120)


def _forged(victim: str) -> list[tuple[bytes, bytes]]:
    """Events of a hostile producer, each refused by a limit, and a cut record (B.4)."""
    meta = {"emitted_at": 0, "source": "forger"}
    base = JobEnqueued(
        event_id="forged-0", job_id="forged-ok", task="s.noop", queue="default", args=b"{}", **meta
    )
    template = JobTemplate(task="s.noop", queue="default", args=b"{}")
    events: list[Event] = [
        replace(base, event_id="forged-1", job_id="j" * 70_000),
        replace(base, event_id="forged-2", queue="bad queue!"),
        replace(base, event_id="forged-3", queue=""),
        replace(base, event_id="forged-4", queue="q" * 300),
        replace(base, event_id="forged-5", max_attempts=0),
        replace(base, event_id="forged-6", run_at=2**63 - 1),
        # The victim's digest on other args: the fold computes its own, so this is a conflict.
        replace(
            base,
            event_id="forged-7",
            job_id=victim,
            task="s.effect",
            args=encode_args(["attacker"], {}),
            idempotency_key="victim",
            body_digest=ids.body_digest("s.effect", "default", encode_args(["mine"], {})),
        ),
        JobLeased(
            event_id="forged-8", job_id=victim, token=2**63 - 1, attempt=1, lease_ms=1, **meta
        ),
        JobLeased(
            event_id="forged-9", job_id=victim, token=5, attempt=1, lease_ms=2**63 - 1, **meta
        ),
        ScheduleUpserted(
            event_id="forged-10",
            schedule_id="random",
            cron="R * * * *",
            timezone="UTC",
            template=template,
            **meta,
        ),
        ScheduleUpserted(
            event_id="forged-11",
            schedule_id="bad-template",
            cron="0 3 * * *",
            timezone="UTC",
            template=replace(template, queue="bad queue!"),
            **meta,
        ),
        ScheduleDeleted(event_id="forged-12", schedule_id="s" * 70_000, **meta),
        base,  # a valid forged job that runs
    ]
    records = [(entity_id(e).encode(), avro.encode_event(e)) for e in events]
    whole = avro.encode_event(base)
    cut = whole[: whole.rindex(struct.pack("<d", base.retry.jitter)) + 3]  # inside a double
    return [*records, (b"cut", cut)]


async def prelease(stack: Stack) -> None:
    """Pre-leased delayed jobs (fold version 3): leases ahead of run_at, starts at run_at."""
    stack.start_node("node-1", "--dispatch-timeout-s", "10", "--prelease-ms", "20000")
    async with stack.app() as app:
        # No worker yet: this one's pre-lease expires unstarted and costs no attempt.
        lonely = await app.get_task("s.noop").options(delay=1.5).enqueue()
        await _until_applied(stack, lonely, "LeaseExpired", 1)
        stack.start_worker("worker-1", "--lease-s", "3")
        delayed = [await app.get_task("s.noop").options(delay=2).enqueue() for _ in range(20)]
        cancelled = await app.get_task("s.noop").options(delay=45).enqueue()
        far = await app.get_task("s.noop").options(delay=3_600).enqueue()
        await produce_raw(stack, _forged_preleases(far, await _run_at(stack, far)))
        await until_status(stack, [lonely, *delayed], Status.SUCCEEDED)
        await _until_applied(stack, cancelled, "JobLeased", 1)  # pre-leased 20 s ahead
        await app.cancel(cancelled, reason="cancelled while pre-leased")
        await until_status(stack, [cancelled], Status.CANCELLED)
        await _until_logged(stack, cancelled, "AttemptSucceeded")  # its worker ran it at run_at
    await until_node_past_the_end(stack)


async def _until_logged(stack: Stack, job_id: str, kind: str) -> None:
    async def logged() -> bool:
        return any(e.kind == kind for e in await stack.timeline(job_id))

    await wait_for(logged, what=f"a {kind} of {job_id}", timeout_s=120)


async def _run_at(stack: Stack, job_id: str) -> int:
    state = await stack.wait_status(job_id, Status.SCHEDULED)
    return state.run_at


def _forged_preleases(job_id: str, run_at: int) -> list[tuple[bytes, bytes]]:
    """A hostile producer's pre-leases of a job due in an hour: too far ahead, wrong run_at.

    Both at the job's next token (it was never leased), so the pre-lease checks judge them: the
    recorded history has tokens 7 and 8, refused for their token first since fold version 8.
    """
    meta = {"emitted_at": 0, "source": "forger", "attempt": 1, "lease_ms": 1_000, "token": 1}
    events = [
        JobLeased(event_id="pre-1", job_id=job_id, not_before=run_at, **meta),
        JobLeased(event_id="pre-2", job_id=job_id, not_before=run_at - 1, **meta),
    ]
    return [(e.job_id.encode(), avro.encode_event(e)) for e in events]


async def retention(stack: Stack) -> None:
    """Issue 11's purges on a real run: short retentions, key windows, forged purges."""
    stack.start_node("node-1", "--dispatch-timeout-s", "10")
    stack.start_worker("worker-1", "--lease-s", "3")
    async with stack.app() as app:
        noop = app.get_task("s.noop")
        short = [await noop.options(retention=2).enqueue() for _ in range(20)]
        cancelled = await noop.options(retention=1, delay=3_600).enqueue()
        await app.cancel(cancelled, reason="not needed")
        keyed = app.get_task("s.effect").options(idempotency_key="k1", key_window=1, retention=60)
        first_run = await keyed.enqueue("run-0")
        await until_status(stack, [first_run], Status.SUCCEEDED)
        await keyed.enqueue("run-0")  # inside the key window: a duplicate
        again = app.get_task("s.noop").options(idempotency_key="k2", key_window=0, retention=1)
        reborn = await again.enqueue()
        await _until_applied(stack, reborn, "JobPurged", 1)
        await _until_applied(stack, cancelled, "JobPurged", 1)
        await again.enqueue()  # after its purge: a new job of the same id
        await keyed.enqueue("run-1")  # after the key window: run 1 of the same id
        await _until_applied(stack, first_run, "AttemptSucceeded", 2)
        waiting = await noop.options(delay=3_600).enqueue()
        await produce_raw(stack, _forged_purges(waiting, first_run))
        for job_id in short:
            await _until_applied(stack, job_id, "JobPurged", 1)
    await until_node_past_the_end(stack)


async def until_node_past_the_end(stack: Stack) -> None:
    end = await stack.read_topic(stack.topics.events)
    for partition in range(stack.partitions):
        offsets = [r.offset for r in end if r.partition == partition]
        if offsets:
            await stack.wait_node_past(partition, max(offsets))


def _forged_purges(waiting: str, finished: str) -> list[tuple[bytes, bytes]]:
    """Purges no node would write: each is rejected with a reason."""
    meta = {"emitted_at": 0, "source": "forger"}
    events = [
        JobPurged(event_id="forged-p1", job_id=waiting, generation=0, **meta),  # not finished
        JobPurged(event_id="forged-p2", job_id="no-such-job", generation=0, **meta),
        JobPurged(event_id="forged-p3", job_id=finished, generation=1, **meta),  # too early
        JobPurged(event_id="forged-p4", job_id=finished, generation=0, **meta),  # an earlier run
    ]
    return [(e.job_id.encode(), avro.encode_event(e)) for e in events]
