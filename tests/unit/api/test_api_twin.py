"""An in-memory twin of the API's read replica, and the fixtures the API's unit tests share.

``MemoryReplica`` folds what a ``testing.MemoryLog`` acknowledged into a real PartitionIndex (one
partition, RocksDB in a temp dir) with the real Projector, so the API's unit tests see the real
fold's verdicts without a broker. The tests at the end check the twin itself.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator, Collection, Mapping
from pathlib import Path
from typing import Any

import httpx
import pytest

from evsched.adapters.avro import encode_event
from evsched.adapters.clock import SYSTEM_CLOCK
from evsched.adapters.index.store import PartitionIndex
from evsched.adapters.kafka.log_cut import parse_cut, resolve_cut
from evsched.adapters.kafka.queues import FixedQueues
from evsched.adapters.kafka.topics import Topics
from evsched.api import create_app
from evsched.api.as_of import PastIndexes, Until
from evsched.client import App
from evsched.core.events import Event, JobEnqueued, entity_id
from evsched.metrics import Metrics
from evsched.ports import Clock, Record
from evsched.runtime.projection.projector import CommitHook, Projector
from evsched.settings import Settings
from evsched.testing import MemoryLog

SETTINGS = Settings(namespace="apitest", event_partitions=1)
TOKEN = "s3cret-token-for-unit-tests"
# The queues the API's unit tests may name (declared: their dispatch topics would exist).
QUEUES = ("default", "mail", "q", "q1", "q2")


class MemoryReplica:
    """The ReplicaView twin: folds the events topic of a MemoryLog on every read and wait."""

    def __init__(
        self, log: MemoryLog, data_dir: Path, *, topic: str, clock: Clock = SYSTEM_CLOCK
    ) -> None:
        self.log = log
        self.topic = topic
        self.data_dir = data_dir
        self.clock = clock
        self.on_commit: CommitHook | None = None
        self.projectors: dict[int, Projector] = {}
        self.paused = False  # a paused replica folds nothing: writes then time out waiting
        self.lag_error: Exception | None = None
        self.failing: dict[int, str] = {}  # as Replica shows a partition whose fold failed

    async def start(self) -> None:
        index = PartitionIndex(self.data_dir / "p0000", 0)
        self.projectors[0] = Projector(index, on_commit=self.on_commit)

    async def stop(self) -> None:
        for projector in self.projectors.values():
            projector.index.close()
        self.projectors.clear()

    @property
    def running(self) -> bool:
        return bool(self.projectors)

    def partition_of(self, key: str) -> int:
        return 0

    def index(self, partition: int) -> PartitionIndex:
        self.sync()
        return self.projectors[partition].index

    def sync(self) -> None:
        if self.paused or not self.projectors:
            return
        projector = self.projectors[0]
        fresh = [
            Record(self.topic, 0, w.offset, self.clock.now_ms(), w.key.encode(), w.value)
            for w in self.log.records
            if w.topic == self.topic and w.offset >= projector.next_offset
        ]
        projector.commit(projector.fold(fresh))

    async def wait_for(self, partition: int, offset: int, timeout_s: float = 10.0) -> None:
        self.sync()
        if self.projectors[partition].index.applied_offset() >= offset:
            return
        # Wait a little, as a replica does, so writers on the loop run meanwhile.
        await asyncio.sleep(min(timeout_s, 0.01))
        self.sync()
        if self.projectors[partition].index.applied_offset() < offset:
            raise TimeoutError(f"twin paused before offset {offset}")

    async def lag(self) -> dict[int, int]:
        if self.lag_error is not None:
            raise self.lag_error
        self.sync()
        pending = sum(1 for w in self.log.records if w.topic == self.topic)
        return {0: pending - self.projectors[0].next_offset}

    async def append(self, event: Event) -> None:
        """Write an event as another producer would (a node or a worker), bypassing the API."""
        await self.log.append(self.topic, entity_id(event), encode_event(event))


class MemoryPast:
    """The ``api.as_of.PastSource`` twin: the MemoryLog's records up to a cut, folded into a
    fresh index (one partition) by the real Projector, cached by the cut's offsets."""

    def __init__(self, log: MemoryLog, root: Path, *, topic: str, clock: Clock = SYSTEM_CLOCK):
        self.log = log
        self.root = root
        self.topic = topic
        self.clock = clock
        self.built: dict[Until, PastIndexes] = {}
        self.building = False  # while True, every index is still being built (a 202)

    def _times(self) -> list[int]:
        return [w.log_at or 0 for w in self.log.records if w.topic == self.topic]

    async def start_offsets(self, partitions: Collection[int]) -> dict[int, int]:
        return dict.fromkeys(partitions, 0)

    async def end_offsets(self, partitions: Collection[int]) -> dict[int, int]:
        return dict.fromkeys(partitions, len(self._times()))

    async def offsets_after(
        self, partitions: Collection[int], at_ms: int
    ) -> dict[int, tuple[int, int] | None]:
        later = [(offset, t) for offset, t in enumerate(self._times()) if t > at_ms]
        return dict.fromkeys(partitions, later[0] if later else None)

    async def resolve(self, text: str, partitions: int) -> Until:
        cut = parse_cut(text)
        until = await resolve_cut(self, range(partitions), cut, now_ms=self.clock.now_ms())
        return tuple(sorted(until.items()))

    async def indexes(self, until: Until, wait_s: float) -> PastIndexes | None:
        if self.building:
            return None
        if until not in self.built:
            directory = self.root / f"as-of-{len(self.built)}"
            index = PartitionIndex(directory / "p0000", 0)
            projector = Projector(index)
            last = dict(until)[0]
            records = [
                Record(self.topic, 0, w.offset, w.log_at or 0, w.key.encode(), w.value)
                for w in self.log.records
                if w.topic == self.topic and w.offset <= last
            ]
            projector.commit(projector.fold(records))
            self.built[until] = PastIndexes(until=until, indexes={0: index}, directory=directory)
        return self.built[until]

    async def close(self) -> None:
        for built in self.built.values():
            built.close()
        self.built.clear()


class Harness:
    """An API over a MemoryLog and a MemoryReplica, with an httpx client speaking ASGI to it."""

    def __init__(self, tmp: Path, **options: Any) -> None:
        self.log = MemoryLog()
        self.replica = MemoryReplica(self.log, tmp / "replica", topic=Topics("apitest").events)
        self.client_app = options.pop("app", None) or App(SETTINGS, log_factory=lambda: self.log)
        self.metrics = Metrics()
        options.setdefault("queues", FixedQueues(QUEUES))
        self.past = MemoryPast(self.log, tmp / "as-of", topic=Topics("apitest").events)
        options.setdefault("past", self.past)
        self.options = options

    async def __aenter__(self) -> Harness:
        await self.replica.start()
        self.api = create_app(
            SETTINGS,
            replica=self.replica,
            app=self.client_app,
            metrics=self.metrics,
            **self.options,
        )
        transport = httpx.ASGITransport(app=self.api)
        self.http = httpx.AsyncClient(transport=transport, base_url="http://api")
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.http.aclose()
        # ASGITransport runs no lifespan: close what it would (the dashboard's admin client)
        await self.api.state.evsched_dashboard.facts.close()
        await self.client_app.close()
        await self.past.close()
        await self.replica.stop()

    def auth(self) -> Mapping[str, str]:
        return {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[Harness]:
    async with Harness(tmp_path) as harness:
        yield harness


# --- the twin itself ----------------------------------------------------------------------------


async def test_twin_folds_what_the_log_acknowledged(api: Harness) -> None:
    response = await api.http.post("/v1/jobs", json={"task": "t"})
    assert response.status_code == 201
    assert api.replica.index(0).applied_offset() == 0
    assert await api.replica.lag() == {0: 0}


async def test_a_paused_twin_times_out_waiting(api: Harness) -> None:
    api.replica.paused = True
    with pytest.raises(TimeoutError):
        await api.replica.wait_for(0, 0)


async def foreign_job(h: Harness, job_id: str) -> None:
    """A job whose id another producer chose (the API only makes ids of its own), folded."""
    digest = hashlib.sha256(job_id.encode()).hexdigest()[:16]  # an event id of any id's bound
    await h.replica.append(
        JobEnqueued(
            event_id=f"foreign-{digest}",
            job_id=job_id,
            emitted_at=h.replica.clock.now_ms(),
            source="foreign",
            task="t",
            queue="default",
            args=b'{"args":[],"kwargs":{}}',
        )
    )
    h.replica.sync()
