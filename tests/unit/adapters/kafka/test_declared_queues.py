"""Issue 9 D.13, node and client: only declared queues are used; nothing creates their topics.

A node holds a job on an undeclared queue back (stage ``undeclared``, one ``queue_undeclared``
line) and looks again every few seconds; the Python client refuses the enqueue, as the API does.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from structlog.testing import capture_logs

from evsched.adapters.kafka.queues import FixedQueues, QueueLookupError
from evsched.adapters.kafka.topics import Mismatch, TopicMisconfigured, TopicMissing
from evsched.client import App
from evsched.errors import PublishError, UnknownQueue
from evsched.runtime.node import dispatch_topics
from evsched.runtime.node.dispatch_topics import RECHECK_S, QueueTopics
from evsched.settings import Settings
from evsched.testing import MemoryLog

SETTINGS = Settings(namespace="unit")


class Catalog:
    """Declared queues the test changes, counting the questions."""

    def __init__(self, *queues: str) -> None:
        self.queues = set(queues)
        self.asked = 0

    async def declared(self, queue: str) -> bool:
        self.asked += 1
        return queue in self.queues


class Checked:
    """Stands in for the admin check of declared topics: records it, raises for some."""

    def __init__(self) -> None:
        self.calls: list[set[str]] = []
        self.misconfigured: set[str] = set()
        self.deleted: set[str] = set()

    async def __call__(self, queues: set[str]) -> None:
        self.calls.append(set(queues))
        if queues & self.deleted:
            raise TopicMissing("gone")
        if bad := queues & self.misconfigured:
            topic = f"unit.dispatch.{min(bad)}"
            raise TopicMisconfigured([Mismatch(topic, "partitions", "1", "6")])


@pytest.fixture
def logs() -> Iterator[list[dict[str, object]]]:
    with capture_logs() as captured:
        yield captured


def topics(catalog: Catalog, monkeypatch: pytest.MonkeyPatch) -> tuple[QueueTopics, Checked]:
    queue_topics = QueueTopics(SETTINGS, catalog)
    checked = Checked()
    monkeypatch.setattr(queue_topics, "_check", checked)
    return queue_topics, checked


async def test_an_undeclared_queue_is_held_briefly_logged_once_and_never_created(
    monkeypatch: pytest.MonkeyPatch, logs: list[dict[str, object]]
) -> None:
    catalog = Catalog("default")
    queue_topics, checked = topics(catalog, monkeypatch)
    first = await queue_topics.ensure({"default", "fresh"})
    assert set(first) == {"fresh"}
    assert (first["fresh"].stage, first["fresh"].hold_s) == ("undeclared", RECHECK_S)
    assert "evsched kafka topics --queue fresh" in first["fresh"].reason
    assert checked.calls == [{"default"}]  # the declared one is checked (never created)
    again = await queue_topics.ensure({"default", "fresh"})
    assert set(again) == {"fresh"}
    assert [e["queue"] for e in logs if e["event"] == "queue_undeclared"] == ["fresh"]
    catalog.queues.add("fresh")  # an operator declares it
    assert await queue_topics.ensure({"default", "fresh"}) == {}
    assert checked.calls == [{"default"}, {"fresh"}]
    asked = catalog.asked
    assert await queue_topics.ensure({"default", "fresh"}) == {}
    assert catalog.asked == asked  # usable queues are not asked about again


async def test_the_undeclared_line_repeats_only_every_report_interval(
    monkeypatch: pytest.MonkeyPatch, logs: list[dict[str, object]]
) -> None:
    queue_topics, _ = topics(Catalog(), monkeypatch)
    clock = [100.0]
    monkeypatch.setattr(dispatch_topics, "monotonic_s", lambda: clock[0])
    for step in range(5):
        clock[0] = 100.0 + step * dispatch_topics.REPORT_EVERY_S / 2
        await queue_topics.ensure({"fresh"})
    assert len([e for e in logs if e["event"] == "queue_undeclared"]) == 3


async def test_a_misconfigured_or_deleted_topic_is_found_among_the_declared(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    queue_topics, checked = topics(Catalog("a", "bad", "gone"), monkeypatch)
    checked.misconfigured.add("bad")
    checked.deleted.add("gone")
    unusable = await queue_topics.ensure({"a", "bad", "gone"})
    assert {q: u.stage for q, u in unusable.items()} == {"bad": "topic", "gone": "undeclared"}
    assert "partitions=1" in unusable["bad"].reason
    assert await queue_topics.ensure({"a"}) == {}  # found usable on the way


async def test_the_client_refuses_an_undeclared_queue_and_writes_nothing() -> None:
    log = MemoryLog()
    app = App(SETTINGS, log_factory=lambda: log, queues=FixedQueues(["default"]))

    @app.task(name="t.mail", queue="mail")
    async def mail() -> None:
        return None

    @app.task(name="t.plain")
    async def plain() -> None:
        return None

    with pytest.raises(UnknownQueue) as refused:
        await app.get_task("t.mail").enqueue()
    assert refused.value.field == "queue" and refused.value.queue == "mail"
    assert "queue 'mail' is not declared" in str(refused.value)
    with pytest.raises(UnknownQueue):
        await app.upsert_schedule("s", "* * * * *", "UTC", "t.mail")
    assert log.records == []
    await app.get_task("t.plain").enqueue()
    await app.cancel("some-job")  # commands name no queue
    assert len(log.records) == 2
    await app.close()


async def test_the_client_reports_a_catalog_it_cannot_ask_as_a_publish_error() -> None:
    class Silent:
        async def declared(self, queue: str) -> bool:
            raise QueueLookupError("cannot list the declared queues: timeout")

    app = App(SETTINGS, log_factory=MemoryLog, queues=Silent())

    @app.task(name="t.plain")
    async def plain() -> None:
        return None

    with pytest.raises(PublishError, match="cannot list"):
        await app.get_task("t.plain").enqueue()
    await app.close()


def test_an_in_memory_log_takes_every_queue_unless_told_otherwise() -> None:
    log = MemoryLog()
    with App(SETTINGS, log_factory=lambda: log) as app:

        @app.task(name="t.any", queue="anything")
        def anything() -> None:
            return None

        app.get_task("t.any").enqueue_sync()
    assert len(log.records) == 1
