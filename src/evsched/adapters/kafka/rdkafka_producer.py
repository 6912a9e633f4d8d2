"""One librdkafka producer driven by a thread of its own, its acks delivered as asyncio futures.

confluent-kafka's ``produce`` only queues a record and never blocks; acks and errors come back
through ``poll``, which blocks. One thread per producer polls; the reports a poll served are
handed to the event loop in one ``call_soon_threadsafe`` (not one per record: a batch of a
thousand acks wakes the loop once). ``confluent_kafka.aio.AIOProducer`` was measured against this
and lost on awaited single appends, and cannot send headers at all (bench/rdkafka_transports.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from evsched.adapters.clock import monotonic_s
from evsched.adapters.kafka.rdkafka_options import rdkafka_config
from evsched.errors import PublishError
from evsched.settings import Settings

# How long a poll waits for reports: the longest the thread takes to notice it should stop.
POLL_S = 0.1
# One metadata request while starting; repeated until START_TIMEOUT_S, so a thread left waiting
# after a refusal ends soon.
LOOK_S = 1.0
START_TIMEOUT_S = 10.0
# Errors librdkafka reports on the side (error_cb) that mean nobody can be reached or let in.
_UNREACHABLE = frozenset({KafkaError._ALL_BROKERS_DOWN, KafkaError._AUTHENTICATION})

# librdkafka's own lines (connection failures, retries) go through logging, not to stderr.
CLIENT_LOGGER = logging.getLogger("evsched.rdkafka")

Report = tuple["asyncio.Future[Message]", KafkaError | None, Message]


def producer_config(settings: Settings, *, client_id: str, **extra: Any) -> dict[str, Any]:
    """An idempotent acks=all producer's configuration, partitioning keys as aiokafka and the
    Java client do (murmur2): the same key lands on the same partition whichever client wrote it.

    ``extra`` are librdkafka properties; ``settings.kafka_options`` are translated
    (UnsupportedKafkaOption when one cannot be).
    """
    return {
        "bootstrap.servers": settings.bootstrap,
        "client.id": client_id,
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": 0,
        "request.timeout.ms": 30_000,
        "partitioner": "murmur2_random",
        **rdkafka_config(settings.kafka_options),
        **extra,
    }


class PolledProducer:
    """A confluent_kafka.Producer and its poll thread, bound to the loop that made it."""

    def __init__(self, config: Mapping[str, Any], *, bootstrap: str) -> None:
        self._loop = asyncio.get_running_loop()
        self._bootstrap = bootstrap
        self._reports: list[Report] = []  # filled and emptied by whichever thread polls
        self._trouble: asyncio.Future[KafkaError] = self._loop.create_future()
        self.fatal: KafkaError | None = None
        # Told of each report whose future was settled already (an ack the caller gave up on).
        self.on_late: Callable[[asyncio.Future[Message]], None] = _ignored
        try:
            self.producer = Producer(
                {**config, "error_cb": self._on_error, "logger": CLIENT_LOGGER}
            )
        except KafkaException as exc:
            raise PublishError(f"cannot make a Kafka producer: {exc.args[0].str()}") from exc
        self._running = True
        self._thread = threading.Thread(target=self._serve, name="evsched-rdkafka", daemon=True)
        self._thread.start()

    async def start(self) -> None:
        """Returns once the cluster answered; PublishError when it is unreachable or refuses."""
        deadline = monotonic_s() + START_TIMEOUT_S
        while True:
            looking = asyncio.ensure_future(
                asyncio.to_thread(self.producer.list_topics, None, LOOK_S)
            )
            await asyncio.wait({looking, self._trouble}, return_when=asyncio.FIRST_COMPLETED)
            if self._trouble.done():
                looking.add_done_callback(_retrieved)
                why = self._trouble.result().str()
                raise PublishError(f"cannot reach Kafka at {self._bootstrap}: {why}")
            with contextlib.suppress(KafkaException):
                looking.result()
                return
            if monotonic_s() > deadline:
                raise PublishError(
                    f"cannot reach Kafka at {self._bootstrap}: no answer within "
                    f"{START_TIMEOUT_S:g} s"
                )

    def send(
        self,
        topic: str,
        key: bytes,
        value: bytes,
        *,
        partition: int | None = None,
        headers: Sequence[tuple[str, bytes]] = (),
    ) -> asyncio.Future[Message]:
        """Queue one record; its future settles with the acknowledged Message or KafkaException.

        Raises KafkaException (a record too large, an unknown partition) or BufferError (the
        queue is full) when librdkafka will not even queue it.
        """
        future: asyncio.Future[Message] = self._loop.create_future()
        delivered = functools.partial(self._delivered, future)
        if partition is None and not headers:  # a client's enqueue: no options to gather
            self.producer.produce(topic, value, key, on_delivery=delivered)
            return future
        options: dict[str, Any] = {"on_delivery": delivered}
        if partition is not None:
            options["partition"] = partition
        if headers:  # a worker's proof (adapters.proofs); most records carry none
            options["headers"] = list(headers)
        self.producer.produce(topic, value, key, **options)
        return future

    async def partition_count(self, topic: str) -> int:
        """How many partitions ``topic`` has; KafkaException when it cannot be told."""
        metadata = await asyncio.to_thread(self.producer.list_topics, topic, START_TIMEOUT_S)
        found = metadata.topics.get(topic)
        if found is None or found.error is not None:
            why = "unknown topic" if found is None else found.error.str()
            raise KafkaException(KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART, why))
        return len(found.partitions)

    def is_fatal(self, exc: BaseException) -> bool:
        """Whether this producer is of no further use (librdkafka's fatal idempotence errors)."""
        if self.fatal is not None:
            return True
        err = exc.args[0] if isinstance(exc, KafkaException) and exc.args else None
        return isinstance(err, KafkaError) and (err.fatal() or err.code() == KafkaError._FATAL)

    async def close(self, timeout_s: float) -> None:
        """Deliver what is queued within ``timeout_s``, then drop the rest: their futures fail."""
        self._running = False
        await asyncio.to_thread(self._thread.join)
        await asyncio.to_thread(self._drain, timeout_s)
        self._settle(self._take())

    def _drain(self, timeout_s: float) -> None:
        if self.producer.flush(timeout_s) > 0:
            self.producer.purge()
            self.producer.flush(0)  # serves the purged records' reports
        self.producer.close()

    def _serve(self) -> None:
        while self._running:
            self.producer.poll(POLL_S)
            if reports := self._take():
                with contextlib.suppress(RuntimeError):  # the loop closed: nobody waits
                    self._loop.call_soon_threadsafe(self._settle, reports)

    def _take(self) -> list[Report]:
        reports, self._reports = self._reports, []
        return reports

    def _delivered(
        self, future: asyncio.Future[Message], err: KafkaError | None, msg: Message
    ) -> None:
        self._reports.append((future, err, msg))

    def _settle(self, reports: list[Report]) -> None:
        for future, err, msg in reports:
            if future.done():
                self.on_late(future)
                continue
            if err is None:
                future.set_result(msg)
            else:
                future.set_exception(KafkaException(err))

    def _on_error(self, err: KafkaError) -> None:
        if err.fatal():
            self.fatal = err
        if err.fatal() or err.code() in _UNREACHABLE:
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(_first, self._trouble, err)


def _ignored(future: asyncio.Future[Message]) -> None:
    return None


def _first(future: asyncio.Future[KafkaError], err: KafkaError) -> None:
    if not future.done():
        future.set_result(err)


def _retrieved(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        with contextlib.suppress(BaseException):
            future.exception()
