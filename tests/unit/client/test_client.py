"""The client: what enqueues and commands write, and that bad calls raise and write nothing."""

from __future__ import annotations

import asyncio
import json
import math
import threading
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from aiokafka.errors import KafkaConnectionError, OutOfOrderSequenceNumber

from evsched.client import App, Context, KafkaEventLog, RetryPolicy
from evsched.commands import MAX_EVENT_BYTES
from evsched.core import ids
from evsched.core.events import (
    JobCancelled,
    JobEnqueued,
    JobRequeued,
    ScheduleDeleted,
    ScheduleUpserted,
)
from evsched.core.state import JobState
from evsched.errors import (
    EvschedError,
    InvalidEnqueue,
    InvalidTask,
    NoJobReader,
    PublishError,
    UnknownTask,
)
from evsched.settings import Settings
from evsched.testing import FrozenClock, MemoryLog, MemoryReader
from tests.states import job_state

NS = "unit"
NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


@pytest.fixture
def clock() -> FrozenClock:
    return FrozenClock(wall_ms=int(NOW.timestamp() * 1000))


@pytest.fixture
def log() -> MemoryLog:
    return MemoryLog()


@pytest.fixture
def app(log: MemoryLog, clock: FrozenClock) -> App:
    app = App(Settings(namespace=NS), name="unit", log_factory=lambda: log, clock=clock)

    @app.task(name="mail.send", queue="mail", max_attempts=5, timeout_s=12.5, priority=3)
    async def send(to: str, *, subject: str = "") -> None:
        return None

    @app.task
    def plain(ctx: Context, n: int) -> int:
        return n

    return app


def only_event(log: MemoryLog) -> Any:
    (record,) = log.records
    return record.event


async def test_enqueue_writes_job_enqueued_keyed_by_job_id(app: App, log: MemoryLog) -> None:
    job_id = await app.get_task("mail.send").enqueue("a@example.com", subject="hi ✓")

    (record,) = log.records
    event = record.event
    assert isinstance(event, JobEnqueued)
    assert (record.topic, record.key) == (f"{NS}.events", job_id)
    assert uuid.UUID(job_id).version == 4
    assert event.job_id == job_id
    assert event.args == '{"args":["a@example.com"],"kwargs":{"subject":"hi ✓"}}'.encode()
    assert (event.task, event.queue, event.priority) == ("mail.send", "mail", 3)
    assert (event.max_attempts, event.timeout_ms, event.run_at) == (5, 12_500, None)
    assert event.body_digest == ids.body_digest("mail.send", "mail", event.args)
    assert (event.source, event.emitted_at) == ("client", int(NOW.timestamp() * 1000))
    assert event.idempotency_key is None


async def test_a_task_is_named_after_its_function_and_still_callable(app: App) -> None:
    plain = app.get_task(f"{__name__}.plain")
    assert plain.takes_context
    assert plain(None, 4) == 4
    assert app.queues == ("mail", "default")


@pytest.mark.parametrize(
    ("options", "run_at"),
    [
        ({"delay": 90}, NOW + timedelta(seconds=90)),
        ({"delay": 0.0015}, NOW + timedelta(milliseconds=2)),
        ({"delay": timedelta(hours=2)}, NOW + timedelta(hours=2)),
        ({"run_at": NOW + timedelta(days=3)}, NOW + timedelta(days=3)),
        ({"run_at": NOW - timedelta(days=3)}, NOW - timedelta(days=3)),
    ],
    ids=["seconds", "rounded-up", "timedelta", "future", "recent-past"],
)
async def test_delay_and_run_at_set_the_start(
    app: App, log: MemoryLog, options: dict[str, Any], run_at: datetime
) -> None:
    await app.get_task("mail.send").options(**options).enqueue("x")

    assert only_event(log).run_at == int(run_at.timestamp() * 1000)


async def test_options_override_priority_and_labels(app: App, log: MemoryLog) -> None:
    task = app.get_task("mail.send").options(priority=9).options(labels={"tenant": "t1"})
    await task.enqueue("x")

    event = only_event(log)
    assert (event.priority, event.labels) == (9, {"tenant": "t1"})


async def test_an_idempotency_key_derives_the_job_id(app: App, log: MemoryLog) -> None:
    keyed = app.get_task("mail.send").options(idempotency_key="order-42")
    first = await keyed.enqueue("x")
    second = await keyed.enqueue("x")

    assert first == second == ids.job_id_for_key("mail", "order-42")
    events = log.events()
    assert [e.idempotency_key for e in events] == ["order-42", "order-42"]
    assert events[0].event_id != events[1].event_id


async def test_enqueue_by_name(app: App, log: MemoryLog) -> None:
    job_id = await app.enqueue("mail.send", "x", subject="s")

    assert only_event(log).job_id == job_id


def with_options(**options: Any) -> Any:
    return lambda a: a.get_task("mail.send").options(**options).enqueue("x")


def schedule(schedule_id: str, cron: str, zone: str, task: str, *args: Any) -> Any:
    return lambda a: a.upsert_schedule(schedule_id, cron, zone, task, args=list(args))


BAD_CALLS = [
    ("args", lambda a: a.get_task("mail.send").enqueue(object())),
    ("args", lambda a: a.get_task("mail.send").enqueue(math.nan)),
    ("args", lambda a: a.get_task("mail.send").enqueue("x", "surplus")),
    ("args", lambda a: a.get_task("mail.send").enqueue("x", bcc="nobody")),
    ("args", lambda a: a.get_task("mail.send").enqueue("x" * MAX_EVENT_BYTES)),
    ("delay", with_options(delay=-1)),
    ("delay", with_options(delay=timedelta(days=-1))),
    ("delay", with_options(delay=math.inf)),
    ("delay", with_options(delay="5")),
    ("run_at", with_options(run_at=datetime(2026, 3, 2))),
    ("run_at", with_options(run_at=NOW.replace(year=2037))),
    ("run_at", with_options(run_at=NOW.replace(year=2024))),
    ("run_at", with_options(delay=1, run_at=NOW)),
    ("priority", with_options(priority=1.5)),
    ("labels", with_options(labels={"n": 1})),
    ("idempotency_key", with_options(idempotency_key="")),
    ("task", lambda a: a.enqueue("no.such.task")),
    ("job_id", lambda a: a.cancel("")),
    ("job_id", lambda a: a.requeue("")),
    ("run_at", lambda a: a.requeue("j", run_at=datetime(2026, 3, 2))),
    ("cron", schedule("s", "61 * * * *", "UTC", "mail.send", "x")),
    ("timezone", schedule("s", "0 * * * *", "Mars/Base", "mail.send", "x")),
    ("args", schedule("s", "0 * * * *", "UTC", "mail.send")),
    ("task", schedule("s", "0 * * * *", "UTC", "nope", "x")),
    ("schedule_id", schedule("", "0 * * * *", "UTC", "mail.send", "x")),
    ("schedule_id", lambda a: a.delete_schedule("")),
]


@pytest.mark.parametrize(
    ("field", "call"), BAD_CALLS, ids=[f"{i}-{f}" for i, (f, _) in enumerate(BAD_CALLS)]
)
async def test_bad_calls_raise_naming_the_field_and_write_nothing(
    app: App, log: MemoryLog, field: str, call: Any
) -> None:
    with pytest.raises(InvalidEnqueue) as raised:
        await call(app)

    assert raised.value.field == field
    assert log.records == []
    assert log.started == 0


def test_arguments_are_checked_by_their_shape_every_time(app: App) -> None:
    # A shape the signature took is remembered; every other one is still bound and refused.
    send = app.get_task("mail.send")
    for _ in range(2):
        send.check_call(["a@example.com"], {"subject": "hi"})
        send.check_call(["a@example.com"], {})
        with pytest.raises(InvalidEnqueue, match="missing a required argument: 'to'"):
            send.check_call([], {"subject": "hi"})
        with pytest.raises(InvalidEnqueue, match="unexpected keyword"):
            send.check_call(["a@example.com"], {"cc": "b@example.com"})
        with pytest.raises(InvalidEnqueue, match="too many"):
            send.check_call(["a@example.com", "b@example.com"], {})


async def test_an_unknown_task_name_is_its_own_error(app: App) -> None:
    with pytest.raises(UnknownTask, match=r"no\.such\.task"):
        await app.enqueue("no.such.task")


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"max_attempts": 0}, "max_attempts"),
        ({"max_attempts": 2.5}, "max_attempts"),
        ({"timeout_s": 0}, "timeout_s"),
        ({"queue": "has space"}, "queue"),
        ({"queue": ""}, "queue"),
        ({"priority": "high"}, "priority"),
        ({"retry": RetryPolicy(multiplier=0.5)}, "retry"),
        ({"retry": RetryPolicy(initial_backoff_ms=10, max_backoff_ms=5)}, "retry"),
        ({"retry_on": (ValueError, "x")}, "retry_on"),
        ({"name": ""}, "name"),
    ],
)
def test_bad_task_definitions_raise(app: App, options: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidTask) as raised:
        app.task(**options)(lambda: None)

    assert raised.value.field == field


def test_a_task_name_is_defined_once(app: App) -> None:
    with pytest.raises(EvschedError, match="twice"):
        app.task(name="mail.send")(lambda: None)


async def test_cancel_and_requeue(app: App, log: MemoryLog) -> None:
    await app.cancel("job-1", reason="user asked")
    await app.requeue("job-1", delay=timedelta(minutes=1))

    cancelled, requeued = log.events()
    assert isinstance(cancelled, JobCancelled)
    assert (cancelled.job_id, cancelled.reason) == ("job-1", "user asked")
    assert isinstance(requeued, JobRequeued)
    assert requeued.run_at == int((NOW + timedelta(minutes=1)).timestamp() * 1000)
    assert [r.key for r in log.records] == ["job-1", "job-1"]


async def test_schedules_are_upserted_and_deleted_keyed_by_schedule_id(
    app: App, log: MemoryLog
) -> None:
    await app.upsert_schedule(
        "nightly", "30 2 * * *", "Europe/Paris", "mail.send", args=["ops@x"], labels={"k": "v"}
    )
    await app.delete_schedule("nightly")

    upserted, deleted = log.events()
    assert isinstance(upserted, ScheduleUpserted)
    assert (upserted.cron, upserted.timezone) == ("30 2 * * *", "Europe/Paris")
    template = upserted.template
    assert (template.task, template.queue, template.max_attempts) == ("mail.send", "mail", 5)
    assert json.loads(template.args) == {"args": ["ops@x"], "kwargs": {}}
    assert template.labels == {"k": "v"}
    assert isinstance(deleted, ScheduleDeleted)
    assert [r.key for r in log.records] == ["nightly", "nightly"]


async def test_get_job_reads_through_the_reader(log: MemoryLog) -> None:
    reader = MemoryReader()
    app = App(Settings(namespace=NS), log_factory=lambda: log, reader=reader)
    assert await app.get_job("missing") is None
    reader.jobs["j"] = state = _state("j")
    assert await app.get_job("j") == state


async def test_get_job_without_a_reader_says_so(app: App) -> None:
    with pytest.raises(NoJobReader):
        await app.get_job("j")


async def test_async_with_closes_the_log(log: MemoryLog, clock: FrozenClock) -> None:
    async with App(Settings(namespace=NS), log_factory=lambda: log, clock=clock) as app:
        await app.cancel("j")
        await app.cancel("j")

    assert (log.started, log.closed) == (1, 1)


def test_enqueue_sync_from_plain_sync_code_and_from_threads(app: App, log: MemoryLog) -> None:
    task = app.get_task("mail.send")
    ids_seen: list[str] = [task.enqueue_sync("main")]
    threads = [
        threading.Thread(target=lambda: ids_seen.append(task.enqueue_sync("thread")))
        for _ in range(4)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    ids_seen.append(app.enqueue_sync("mail.send", "by-name"))
    app.cancel_sync(ids_seen[0])
    app.close_sync()

    assert len(set(ids_seen)) == 6
    assert [type(e).__name__ for e in log.events()].count("JobEnqueued") == 6
    assert (log.started, log.closed) == (1, 1)


def test_sync_calls_raise_the_same_errors(app: App, log: MemoryLog) -> None:
    with app, pytest.raises(InvalidEnqueue):
        app.get_task("mail.send").options(delay=-5).enqueue_sync("x")
    assert log.records == []


def test_asyncio_run_twice_uses_a_fresh_producer_each_time(app: App, log: MemoryLog) -> None:
    asyncio.run(app.cancel("a"))
    asyncio.run(app.cancel("b"))

    assert log.started == 2
    assert [r.key for r in log.records] == ["a", "b"]


async def test_one_app_cannot_share_a_producer_across_running_loops(app: App) -> None:
    await app.cancel("here")
    errors: list[BaseException] = []

    def other_loop() -> None:
        try:
            asyncio.run(app.cancel("there"))
        except EvschedError as exc:
            errors.append(exc)

    thread = threading.Thread(target=other_loop)
    thread.start()
    await asyncio.to_thread(thread.join)
    assert len(errors) == 1
    assert "another running event loop" in str(errors[0])


def _state(job_id: str) -> JobState:
    return job_state(job_id, max_attempts=1, timeout_ms=1)


# --- the Kafka event log, with aiokafka's producer replaced -------------------------------------


class FakeMetadata:
    partition = 2
    offset = 41
    timestamp = 1_000
    timestamp_type = 0  # CreateTime, like aiokafka's RecordMetadata for such a topic


class FakeProducer:
    made: list[FakeProducer] = []

    def __init__(self, fail_with: list[BaseException]) -> None:
        self.fail_with = fail_with
        self.sent: list[tuple[str, bytes, bytes]] = []
        self.stopped = False
        FakeProducer.made.append(self)

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        self.stopped = True

    async def send(self, topic: str, value: bytes, *, key: bytes) -> asyncio.Future[Any]:
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        if self.fail_with:
            future.set_exception(self.fail_with.pop(0))
        else:
            self.sent.append((topic, key, value))
            future.set_result(FakeMetadata())
        return future


@pytest.fixture
def fake_producers(monkeypatch: pytest.MonkeyPatch) -> list[BaseException]:
    failures: list[BaseException] = []
    FakeProducer.made = []
    monkeypatch.setattr(
        "evsched.adapters.kafka.clients.producer", lambda settings, **_: FakeProducer(failures)
    )
    return failures


async def test_a_fatal_producer_error_replaces_the_producer_and_resends(
    fake_producers: list[BaseException],
) -> None:
    fake_producers.append(OutOfOrderSequenceNumber())
    events = KafkaEventLog(Settings(namespace=NS), client_id="c")

    appended = await events.append("t", "key", b"v")
    await events.close()

    first, second = FakeProducer.made
    assert first.stopped and second.stopped
    assert second.sent == [("t", b"key", b"v")]
    assert (appended.partition, appended.offset) == (2, 41)


async def test_other_kafka_errors_become_publish_errors(
    fake_producers: list[BaseException],
) -> None:
    fake_producers.append(KafkaConnectionError())
    events = KafkaEventLog(Settings(namespace=NS), client_id="c")

    with pytest.raises(PublishError, match="writing to 't' failed"):
        await events.append("t", "key", b"v")
    await events.close()

    assert len(FakeProducer.made) == 1


async def test_a_second_fatal_error_in_a_row_is_a_publish_error(
    fake_producers: list[BaseException],
) -> None:
    fake_producers.extend([OutOfOrderSequenceNumber(), OutOfOrderSequenceNumber()])
    events = KafkaEventLog(Settings(namespace=NS), client_id="c")

    with pytest.raises(PublishError):
        await events.append("t", "key", b"v")
    await events.close()

    assert len(FakeProducer.made) == 2
