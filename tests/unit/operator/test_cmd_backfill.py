"""``evsched schedules backfill`` over the twins (a MemoryLog, the replica folded from it): a paused
schedule is refused before anything is written, and a fire the fold rejects gets no job, even when
the pause lands after the replica was read."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from evsched.adapters import avro
from evsched.adapters.index.store import PartitionIndex
from evsched.adapters.kafka.topics import Topics
from evsched.client import App
from evsched.core import events as ev
from evsched.core.schedule import cron
from evsched.operator import register, session
from evsched.operator.commands import schedule_backfill
from evsched.operator.replica_dir import LocalIndex
from evsched.ports import Record
from evsched.runtime.projection.projector import Projector
from evsched.settings import Settings
from evsched.testing import MemoryLog

DAY = 86_400_000
T0 = 1_767_225_600_000  # 2026-01-01T00:00Z
EVENTS = Topics(Settings().namespace).events
RANGE = ["--from", "2026-01-01T00:00:00Z", "--to", "2026-01-03T23:59:59Z"]  # three 03:00 slots


class Replica:
    """The MemoryLog and the one-partition replica the command reads, folded from it on demand;
    ``pause_after_read`` pauses the schedule just after the command's first read."""

    def __init__(self, data_dir: Path) -> None:
        self.log = MemoryLog()
        self.log.log_at = T0 + 10 * DAY  # every slot of RANGE is in the past
        self.data_dir = data_dir
        self.pause_after_read = False

    async def append(self, event: ev.Event) -> None:
        await self.log.append(EVENTS, ev.entity_id(event), avro.encode_event(event))

    def add(self, event: ev.Event) -> None:
        asyncio.run(self.append(event))

    def fold(self, local: LocalIndex) -> None:
        records = [
            Record(EVENTS, 0, w.offset, w.log_at or 0, w.key.encode(), w.value)
            for w in self.log.records
        ]
        projector = Projector(local.indexes[0])
        projector.commit(projector.fold(records))

    async def catch_up(self, settings: Settings, data_dir: Path, **_: Any) -> LocalIndex:
        local = LocalIndex({0: PartitionIndex(self.data_dir / "p0000", 0)})
        self.fold(local)
        if self.pause_after_read:
            await self.append(paused())
        return local

    async def refresh(
        self, settings: Settings, local: LocalIndex, *, at_least: Mapping[int, int], **_: Any
    ) -> None:
        self.fold(local)


def upserted() -> ev.ScheduleUpserted:
    template = ev.JobTemplate(task="reports.nightly", queue="default", args=b"[]")
    return ev.ScheduleUpserted(
        event_id="u1", schedule_id="nightly", emitted_at=0, source="client",
        cron="0 3 * * *", timezone="UTC", template=template,
    )  # fmt: skip


def paused() -> ev.SchedulePaused:
    return ev.SchedulePaused(
        event_id="p1", schedule_id="nightly", emitted_at=0, source="operator", reason="audit"
    )


@pytest.fixture
def replica(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Replica:
    twin = Replica(tmp_path / "replica")
    twin.add(upserted())  # its next due slot is after RANGE: RANGE's slots may be backfilled
    monkeypatch.setattr(session, "catch_up", twin.catch_up)
    monkeypatch.setattr(session, "refresh", twin.refresh)
    monkeypatch.setattr(
        schedule_backfill,
        "App",
        lambda settings, name: App(settings, name=name, log_factory=lambda: twin.log),
    )
    return twin


def backfill(*args: str) -> tuple[int, str]:
    cli = typer.Typer()
    register(cli)
    result = CliRunner().invoke(cli, ["schedules", "backfill", "nightly", *RANGE, *args])
    return result.exit_code, result.output


def test_a_backfill_fires_each_slot_and_enqueues_its_job(replica: Replica) -> None:
    code, output = backfill("--json")
    assert code == 0, output
    verdicts = [(w["kind"], w["verdict"]) for w in json.loads(output)]
    assert verdicts == [("ScheduleFired", "applied")] * 3 + [("JobEnqueued", "applied")] * 3
    slots = [e.fire_at for e in replica.log.events(ev.JobEnqueued)]
    assert slots == [cron.next_fire_at("0 3 * * *", "UTC", T0 + n * DAY) for n in range(3)]


def test_a_backfill_of_a_paused_schedule_writes_nothing_and_exits_5(replica: Replica) -> None:
    replica.add(paused())
    before = len(replica.log.records)
    code, output = backfill()
    assert code == 5
    assert "schedule nightly is paused" in " ".join(output.split())
    assert len(replica.log.records) == before


def test_a_fire_rejected_for_a_pause_after_the_read_gets_no_job(replica: Replica) -> None:
    replica.pause_after_read = True
    code, output = backfill("--json")
    assert code == 5, output
    judged = json.loads(output)
    assert [(w["kind"], w["verdict"]) for w in judged] == [("ScheduleFired", "rejected")] * 3
    assert "schedule nightly is paused" in judged[0]["reading"]
    assert replica.log.events(ev.JobEnqueued) == []
