"""What the outbox writes: the client's own JobEnqueued bytes, and bad calls refused by name.

Against the database and the broker: tests/integration/test_outbox*.py.
"""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime

import pytest
from typer.testing import CliRunner

from evsched.adapters import avro
from evsched.cli import app as evsched
from evsched.client import App
from evsched.core import ids
from evsched.core.events import JobEnqueued
from evsched.errors import InvalidEnqueue
from evsched.outbox import InvalidTable, Outbox, OutboxTable
from evsched.settings import Settings
from evsched.testing import FrozenClock, MemoryLog

NOW_MS = int(datetime(2026, 12, 7, 12, 0, tzinfo=UTC).timestamp() * 1000)
runner = CliRunner()


@pytest.fixture
def log() -> MemoryLog:
    return MemoryLog()


@pytest.fixture
def app(log: MemoryLog) -> App:
    app = App(
        Settings(namespace="unit"), name="unit", log_factory=lambda: log, clock=FrozenClock(NOW_MS)
    )

    @app.task(name="send_receipt", queue="mail", max_attempts=4)
    def send_receipt(order_id: int, *, copy: bool = False) -> None:
        return None

    return app


def _without_event_id(event: object) -> object:
    assert isinstance(event, JobEnqueued)
    return dataclasses.replace(event, event_id="-")


async def test_the_row_holds_what_app_enqueue_sends_for_the_same_call(
    app: App, log: MemoryLog
) -> None:
    task = app.get_task("send_receipt")
    entry = Outbox().entry(task.call(42, copy=True), key="order-42")
    sent_id = await task.options(idempotency_key="order-42").enqueue(42, copy=True)

    (sent,) = log.records
    assert entry.job_id == sent_id == ids.job_id_for_key("mail", "order-42")
    assert entry.key == sent.key == entry.job_id  # the same Kafka key: the same partition
    # Only the event id differs (each build draws one): the row's is fixed at insert.
    assert _without_event_id(avro.decode_event(entry.event)) == _without_event_id(sent.event)
    assert avro.decode_event(entry.event) == entry.enqueued
    assert entry.event == avro.encode_event(entry.enqueued)


def test_a_call_without_key_gets_a_fresh_id_fixed_in_the_row(app: App) -> None:
    task = app.get_task("send_receipt")
    first, second = (Outbox().entry(task.call(1)) for _ in range(2))
    assert first.job_id != second.job_id
    assert avro.decode_event(first.event).job_id == first.job_id  # type: ignore[union-attr]


def test_bad_calls_are_refused_naming_the_field(app: App) -> None:
    task = app.get_task("send_receipt")
    with pytest.raises(InvalidEnqueue) as bad_args:
        Outbox().entry(task.call("one", "two", "three"))
    assert bad_args.value.field == "args"
    with pytest.raises(InvalidEnqueue) as bad_key:
        Outbox().entry(task.call(1), key="")
    assert bad_key.value.field == "idempotency_key"
    with pytest.raises(InvalidEnqueue) as step:
        Outbox().entry(task.options(after=["a" * 8]).call(1))
    assert step.value.field == "after"


async def test_a_connection_the_outbox_cannot_write_through_is_a_type_error(app: App) -> None:
    task = app.get_task("send_receipt")
    with pytest.raises(TypeError, match="enqueue_sync"):
        await Outbox().enqueue(object(), task.call(1))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="psycopg 3 or SQLAlchemy 2"):
        Outbox().enqueue_sync("postgresql://x", task.call(1))  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["", "Orders", "1outbox", "a-b", 'x"; DROP TABLE y', "a" * 49])
def test_a_table_name_is_a_plain_identifier(name: str) -> None:
    with pytest.raises(InvalidTable):
        OutboxTable(name)


def test_the_table_notifies_its_own_channel() -> None:
    table = OutboxTable("shop_outbox")
    assert "pg_notify('shop_outbox'" in table.create()
    assert table.sql("listen") == 'LISTEN "shop_outbox"'


def test_the_commands_refuse_a_bad_table_or_an_unreachable_database_in_one_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from evsched.cli import relay as relay_cli

    # Logging to the runner's stderr, closed after the call, would break every later test's logs.
    monkeypatch.setattr(relay_cli, "configure_logging", lambda **kw: None)
    bad = runner.invoke(evsched, ["outbox", "init", "--dsn", "postgresql://x", "--table", "A-b"])
    assert bad.exit_code == 2, bad.output
    assert "table: 'A-b' is not a lower-case identifier" in bad.output
    relay = runner.invoke(evsched, ["relay", "--dsn", "postgresql://x", "--table", "A-b"])
    assert relay.exit_code == 2, relay.output
    assert "table" in relay.output
    down = runner.invoke(
        evsched, ["outbox", "status", "--dsn", "postgresql://nobody@127.0.0.1:1/none"]
    )
    assert down.exit_code == 4, down.output
    assert "127.0.0.1" in down.output and "Traceback" not in down.output
