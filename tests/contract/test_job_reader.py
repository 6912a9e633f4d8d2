"""The JobReader contract: ``testing.MemoryReader`` and the replica the API serves reads from.

What a handler's fence check and the API rely on: an unknown job reads as None, a written job
reads as the state the fold projected from the log, and later events move it.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Protocol

import pytest

from evsched.adapters.avro import encode_event
from evsched.adapters.clock import SYSTEM_CLOCK
from evsched.adapters.kafka.event_log import KafkaEventLog
from evsched.adapters.kafka.topics import Topics
from evsched.core.events import JobCancelled, JobEnqueued, JobEvent, Position
from evsched.core.fold import fold
from evsched.core.state import Status
from evsched.ports import JobReader
from evsched.runtime.replica import Replica
from evsched.settings import Settings
from evsched.testing import MemoryReader


class ReaderHarness(Protocol):
    reader: JobReader

    async def write(self, event: JobEvent) -> None:
        """Put ``event`` in the log; return once the reader has folded it."""
        ...


def enqueued(job_id: str) -> JobEnqueued:
    return JobEnqueued(
        event_id=str(uuid.uuid4()),
        job_id=job_id,
        emitted_at=SYSTEM_CLOCK.now_ms(),
        source="contract",
        task="send_mail",
        queue="default",
        args=b'{"to": "a@example.com"}',
        max_attempts=5,
    )


def cancelled(job_id: str) -> JobCancelled:
    return JobCancelled(
        event_id=str(uuid.uuid4()),
        job_id=job_id,
        emitted_at=SYSTEM_CLOCK.now_ms(),
        source="contract",
        reason="not needed",
    )


class JobReaderContract:
    """The suite; a subclass provides the ``harness`` fixture."""

    async def test_an_unknown_job_reads_as_none(self, harness: ReaderHarness) -> None:
        assert await harness.reader.job("job-unknown") is None
        await harness.write(enqueued("job-known"))
        assert await harness.reader.job("job-unknown") is None

    async def test_a_written_job_reads_as_its_projected_state(self, harness: ReaderHarness) -> None:
        event = enqueued("job-1")
        await harness.write(event)
        state = await harness.reader.job("job-1")
        assert state is not None
        assert (state.job_id, state.status) == ("job-1", Status.SCHEDULED)
        assert (state.task, state.queue, state.args) == (event.task, event.queue, event.args)
        assert (state.max_attempts, state.attempt) == (5, 0)

    async def test_later_events_move_the_state(self, harness: ReaderHarness) -> None:
        await harness.write(enqueued("job-1"))
        await harness.write(cancelled("job-1"))
        state = await harness.reader.job("job-1")
        assert state is not None and state.status is Status.CANCELLED


# --- the twin -------------------------------------------------------------------------------------


class MemoryHarness:
    """Fills the twin with what the real fold makes of each event, at the next offset."""

    def __init__(self) -> None:
        self.memory = MemoryReader()
        self.reader: JobReader = self.memory
        self._offset = 0

    async def write(self, event: JobEvent) -> None:
        position = Position(partition=0, offset=self._offset, log_at=SYSTEM_CLOCK.now_ms())
        self._offset += 1
        state, _ = fold(self.memory.jobs.get(event.job_id), event, position)
        if state is not None:
            self.memory.jobs[event.job_id] = state


class TestMemoryReader(JobReaderContract):
    @pytest.fixture
    def harness(self) -> ReaderHarness:
        return MemoryHarness()


# --- the API's replica on Kafka ---------------------------------------------------------------


class ReplicaHarness:
    def __init__(self, settings: Settings, data_dir: Path) -> None:
        self.replica = Replica(settings, data_dir, client_id="evsched-contract-replica")
        self.reader: JobReader = self.replica
        self.log = KafkaEventLog(settings, client_id="evsched-contract")
        self.topic = Topics(settings.namespace).events

    async def write(self, event: JobEvent) -> None:
        appended = await self.log.append(self.topic, event.job_id, encode_event(event))
        await self.replica.wait_for(appended.partition, appended.offset, timeout_s=30.0)


@pytest.mark.broker
class TestReplicaReader(JobReaderContract):
    @pytest.fixture
    async def harness(self, settings: Settings, tmp_path: Path) -> AsyncIterator[ReaderHarness]:
        real = ReplicaHarness(settings, tmp_path / "replica")
        await real.log.start()
        async with real.replica:
            yield real
        await real.log.close()
