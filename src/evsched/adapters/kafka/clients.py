"""Thin aiokafka wiring: producers and consumers with evsched's settings, records, error mapping."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import structlog
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.errors import (
    InvalidProducerEpoch,
    KafkaError,
    KafkaTimeoutError,
    OutOfOrderSequenceNumber,
    ProducerFenced,
    TransactionalIdAuthorizationFailed,
    UnknownProducerId,
)

from evsched.errors import PublishError
from evsched.ports import Record
from evsched.settings import Settings

log = structlog.get_logger("evsched.transport")

# How long closing a producer may take to deliver what it still holds (stop_producer).
STOP_TIMEOUT_S = 10.0

# Errors after which a producer can never be used again: close it and make a new one.
FATAL_PRODUCER_ERRORS: tuple[type[BaseException], ...] = (
    ProducerFenced,
    OutOfOrderSequenceNumber,
    InvalidProducerEpoch,
    UnknownProducerId,
    TransactionalIdAuthorizationFailed,
)


def to_record(raw: Any) -> Record:
    return Record(
        topic=raw.topic,
        partition=raw.partition,
        offset=raw.offset,
        log_at=raw.timestamp,
        key=raw.key,
        value=raw.value,
        headers=tuple(raw.headers or ()),
    )


def is_fatal_producer_error(exc: BaseException) -> bool:
    return isinstance(exc, FATAL_PRODUCER_ERRORS)


def producer(
    settings: Settings, *, client_id: str, transactional_id: str | None = None, **extra: Any
) -> AIOKafkaProducer:
    """An idempotent producer (acks=all); transactional when ``transactional_id`` is given."""
    options: dict[str, Any] = {
        "bootstrap_servers": settings.bootstrap,
        "client_id": client_id,
        "enable_idempotence": True,
        "acks": "all",
        "linger_ms": 0,
        "request_timeout_ms": 30_000,
        **settings.kafka_options,
        **extra,
    }
    if transactional_id is not None:
        options["transactional_id"] = transactional_id
        options["transaction_timeout_ms"] = 60_000
    return AIOKafkaProducer(**options)


async def start_producer(
    settings: Settings, *, client_id: str, transactional_id: str | None = None, **extra: Any
) -> AIOKafkaProducer:
    """A started ``producer``; one that cannot start is stopped and raises PublishError."""
    fresh = producer(settings, client_id=client_id, transactional_id=transactional_id, **extra)
    try:
        await fresh.start()
    except KafkaError as exc:
        await stop_producer(fresh)
        raise PublishError(f"cannot reach Kafka at {settings.bootstrap}: {exc!r}") from exc
    return fresh


async def stop_producer(spent: AIOKafkaProducer, timeout_s: float = STOP_TIMEOUT_S) -> None:
    """Stop a producer within ``timeout_s``; a failure is only logged (what it had not sent was
    reported already).

    ``stop()`` first delivers every record the producer holds, and an idempotent producer retries
    a record for as long as its partition lacks replicas: past the timeout the records still held
    are failed (their senders were told already: an append gives up on its ack, not on the
    record) so that closing a client during an outage does not hang.
    """
    stopping = asyncio.ensure_future(spent.stop())
    try:
        await asyncio.wait_for(asyncio.shield(stopping), timeout_s)
    except TimeoutError:
        held = KafkaTimeoutError(f"producer closed with records unacknowledged after {timeout_s} s")
        if timeout_s > 0:  # at 0 the caller drops records it already reported as refused
            log.warning("producer_stop_abandoned", error=str(held))
        _quiet_sender(spent)
        # aiokafka has no public way to drop what it holds; this is what its own sender does
        # when it dies (Sender._fail_all).
        spent._message_accumulator.fail_all(held)
        # A batch still in flight then finds itself gone when its answer comes (a KeyError in
        # aiokafka's sender): the producer is being discarded, so whatever its sender raises
        # now is of no use to anyone.
        with contextlib.suppress(Exception):
            await stopping
        # stop() may have raised before it closed the client: its connections go either way.
        with contextlib.suppress(Exception):
            await spent.client.close()
    except KafkaError as exc:
        log.warning("producer_stop_failed", error=repr(exc))


def _quiet_sender(spent: AIOKafkaProducer) -> None:
    """The discarded producer's sender may now die (a batch in flight finds itself failed): its
    end is seen here, and aiokafka's own handler of it skipped, which fails an idempotent
    producer's transaction state that does not exist (an AttributeError in a loop callback,
    printed as a traceback on stderr: the CLI's one-line error had one under it)."""
    sender = getattr(spent, "_sender", None)
    if sender is not None and sender.sender_task is not None:
        sender.sender_task.remove_done_callback(sender._fail_all)
        sender.sender_task.add_done_callback(_seen)


def _seen(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()


# The group's failure detection: a member (node or worker) killed without leaving the group is
# noticed after session_timeout_ms, and its partitions move to the others. The broker's minimum
# is 6 s (group.min.session.timeout.ms). A survivor hears of the rebalance at its next
# heartbeat, every half second: the survivors act at most 6.5 s after a kill (the session runs
# from the victim's last heartbeat, before the kill). Live members get rebalance_timeout_ms to
# rejoin (closing their partitions first). A SIGKILLed node's partitions stall for about 7-8 s
# on a quiet machine (tests/integration/test_engine_takeover.py measures it; docs/benchmarks.md,
# "Take-over stall"); a SIGKILLed worker's dispatch partitions move to the pool's other workers
# as fast. EVSCHED_SESSION_TIMEOUT_MS and EVSCHED_HEARTBEAT_INTERVAL_MS override the first two.
GROUP_TIMEOUTS = {
    "session_timeout_ms": 6_000,
    "heartbeat_interval_ms": 500,
    "rebalance_timeout_ms": 10_000,
}


# How soon a producer or a worker pool sees partitions added to a dispatch topic while it runs
# (``evsched queues partitions``): their metadata is read again at least this often (Kafka's
# default is 5 minutes).
GROWTH_NOTICE_MS = 10_000


def group_timeouts(settings: Settings) -> dict[str, int]:
    """GROUP_TIMEOUTS with the session timeout and heartbeat interval ``settings`` set, if any."""
    session = settings.session_timeout_ms or GROUP_TIMEOUTS["session_timeout_ms"]
    # Kafka wants heartbeats well inside the session: a third of it at most.
    heartbeat = settings.heartbeat_interval_ms or min(
        GROUP_TIMEOUTS["heartbeat_interval_ms"], session // 3
    )
    return {**GROUP_TIMEOUTS, "session_timeout_ms": session, "heartbeat_interval_ms": heartbeat}


def consumer(
    settings: Settings, *topics: str, group_id: str | None, **extra: Any
) -> AIOKafkaConsumer:
    """A read_committed consumer without auto-commit: offsets are committed by the caller."""
    options: dict[str, Any] = {
        "bootstrap_servers": settings.bootstrap,
        "group_id": group_id,
        "isolation_level": "read_committed",
        "enable_auto_commit": False,
        "auto_offset_reset": "earliest",
        # Under load the broker answers a fetch once 64 KiB are ready or after 10 ms, rather than
        # at every record: a fetch per ten milliseconds per consumer at most, batches instead of
        # single records downstream (fewer node transactions, fewer worker produce and commit
        # requests), at a cost of at most 10 ms before a record is seen.
        "fetch_max_wait_ms": 10,
        "fetch_min_bytes": 64 << 10,
        "max_poll_records": 2_000,
        **settings.kafka_options,
        **extra,
    }
    return AIOKafkaConsumer(*topics, **options)


__all__ = [
    "GROWTH_NOTICE_MS",
    "KafkaError",
    "consumer",
    "group_timeouts",
    "is_fatal_producer_error",
    "producer",
    "start_producer",
    "stop_producer",
    "to_record",
]
