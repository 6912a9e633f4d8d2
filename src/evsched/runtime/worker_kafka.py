"""The worker on Kafka: its dispatch consumer, start positions, topics and the command line."""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
import sys
from collections.abc import Iterable, Sequence
from typing import Annotated, Any

import structlog
import typer
from aiokafka import ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import CommitFailedError

from evsched.adapters.clock import SYSTEM_CLOCK
from evsched.adapters.kafka import GROUP_TIMEOUTS, KafkaError, consumer, to_record
from evsched.adapters.signing import UNSIGNED_ENV, DispatchKey, dispatch_key_from_env
from evsched.adapters.topics import TopicMisconfigured, TopicProvisioningError, ensure_topics
from evsched.client.app import App
from evsched.client.loader import load_app
from evsched.client.transport import KafkaEventLog
from evsched.errors import EvschedError
from evsched.logging import configure_logging
from evsched.metrics import MetricsAddr, WorkerInstruments, metrics_port_option, serve_metrics
from evsched.ports import Clock, Record
from evsched.runtime.worker import (
    START_LOOKBACK_MS,
    Worker,
    WorkerConfig,
    serve,
    wait_set,
)
from evsched.settings import SettingsError

log = structlog.get_logger("evsched.worker")
# While the broker is unreachable at start: the first retry after this, doubling up to the max.
BROKER_RETRY_FIRST_S = 0.5
BROKER_RETRY_MAX_S = 15.0
BROKER_TRY_S = 10.0


class KafkaDispatchFeed:
    """A consumer in group ``<ns>.workers.<pool>`` on the dispatch topics of the pool's queues.

    It fetches only as many records as the worker can start; while the worker is full, its
    partitions are paused and polled, so the group does not evict it for being idle.

    Where the pool has no committed offset yet (a new pool, or a queue newly added to it), it
    starts at the records of the last ``start_lookback_ms``, not at offset 0: anything older is
    past its start deadline and would only be skipped, or re-run a job that has long finished.
    That start is committed at once, so every later member of the pool starts there as well.
    """

    def __init__(
        self,
        consumer_factory: Any,
        topics: Sequence[str] = (),
        *,
        start_lookback_ms: int = START_LOOKBACK_MS,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self._factory = consumer_factory
        self._topics = tuple(topics)
        self._lookback_ms = start_lookback_ms
        self._clock = clock
        self._consumer: Any = None

    async def start(self) -> None:
        self._consumer = self._factory()
        if self._topics:
            self._consumer.subscribe(self._topics, listener=_StartWhereLive(self))
        try:
            await self._consumer.start()
        except KafkaError as exc:
            await self._consumer.stop()
            raise EvschedError(f"the worker's consumer could not start: {exc!r}") from exc

    async def close(self) -> None:
        if self._consumer is not None:
            await self._consumer.stop()

    async def take(self, max_records: int, timeout_s: float) -> list[Record]:
        c = self._consumer
        try:
            if max_records <= 0:
                c.pause(*c.assignment())
                await c.getmany(timeout_ms=0)
                return []
            if paused := c.paused():
                c.resume(*paused)
            batches = await c.getmany(timeout_ms=int(timeout_s * 1000), max_records=max_records)
        except KafkaError as exc:
            log.warning("dispatch_poll_failed", error=repr(exc))
            await asyncio.sleep(timeout_s)  # back off, then let the loop poll again
            return []
        if not batches:
            return []
        if not await self._commit({tp: rs[-1].offset + 1 for tp, rs in batches.items()}):
            return []
        return [to_record(raw) for records in batches.values() for raw in records]

    async def position_new(self, assigned: Iterable[TopicPartition]) -> None:
        """Give partitions the pool has never committed a start, and commit it."""
        c = self._consumer
        fresh = [tp for tp in assigned if await c.committed(tp) is None]
        if not fresh:
            return
        since = self._clock.now_ms() - self._lookback_ms
        found = await c.offsets_for_times(dict.fromkeys(fresh, since))
        ends = await c.end_offsets(fresh)
        starts = {tp: ends[tp] if found.get(tp) is None else found[tp].offset for tp in fresh}
        for tp, offset in starts.items():
            c.seek(tp, offset)
        log.info("dispatch_start_positioned", offsets=_named(starts), lookback_ms=self._lookback_ms)
        try:
            await c.commit(starts)
        except KafkaError as exc:  # the next take commits it; until then a rebalance re-decides
            log.warning("dispatch_start_commit_failed", error=repr(exc))

    async def _commit(self, offsets: dict[Any, int]) -> bool:
        """Commit what was taken; False when the records must not run here."""
        try:
            await self._consumer.commit(offsets)
        except CommitFailedError as exc:
            # The group rebalanced under this member (e.g. it was evicted after a freeze): the
            # offsets stay where they were, and whoever owns the partitions after the rebalance
            # (another member, or this one after rejoining) reads these records again from there.
            # Running them here as well would run the same live token twice, which fencing
            # cannot tell apart.
            log.warning(
                "dispatch_dropped_after_rebalance", offsets=_named(offsets), error=repr(exc)
            )
            return False
        except KafkaError as exc:
            # Anything else: the records may be dispatched again, which fencing makes safe;
            # dropping them could lose them.
            log.warning("dispatch_commit_failed", error=repr(exc))
        return True


def _named(offsets: dict[Any, int]) -> dict[str, int]:
    return {f"{tp.topic}[{tp.partition}]": offset for tp, offset in sorted(offsets.items())}


class _StartWhereLive(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, feed: KafkaDispatchFeed) -> None:
        self._feed = feed

    async def on_partitions_revoked(self, revoked: Iterable[TopicPartition]) -> None:
        return None

    async def on_partitions_assigned(self, assigned: Iterable[TopicPartition]) -> None:
        await self._feed.position_new(assigned)


def kafka_worker(
    app: App,
    config: WorkerConfig,
    instruments: WorkerInstruments | None = None,
    dispatch_key: DispatchKey | None = None,
) -> Worker:
    """A worker on the real broker: its own producer and a consumer in ``<ns>.workers.<pool>``."""
    client_id = f"evsched-worker-{config.worker_id}"
    topics = [app.topics.dispatch(queue) for queue in config.queues]
    group = f"{app.settings.namespace}.workers.{config.pool}"
    feed = KafkaDispatchFeed(
        lambda: consumer(app.settings, group_id=group, client_id=client_id, **GROUP_TIMEOUTS),
        topics,
        start_lookback_ms=config.start_lookback_ms,
    )
    events = KafkaEventLog(app.settings, client_id=client_id)
    return Worker(
        app, config, feed=feed, events=events, instruments=instruments, dispatch_key=dispatch_key
    )


async def ensure_worker_topics(app: App, config: WorkerConfig, timeout_s: float = 30.0) -> None:
    """Create the pool's dispatch topics if missing, as the node would (and check them).

    A consumer subscribed to a topic that does not exist yet only sees it at its next metadata
    refresh (minutes), so a worker started before the node would sit idle that long.
    """
    settings = app.settings
    await ensure_topics(
        settings.bootstrap,
        settings.namespace,
        event_partitions=settings.event_partitions,
        queues=config.queues,
        timeout_s=timeout_s,
        **dict(settings.kafka_options),
    )


async def wait_for_broker(app: App, config: WorkerConfig, stop: asyncio.Event) -> bool:
    """Provision the pool's topics, retrying with backoff while the broker is unreachable.

    False when ``stop`` was set first. A misconfigured topic is not retried: TopicMisconfigured.
    """
    delay_s = BROKER_RETRY_FIRST_S
    for attempt in itertools.count(1):
        try:
            await ensure_worker_topics(app, config, timeout_s=BROKER_TRY_S)
        except TopicMisconfigured:
            raise
        except TopicProvisioningError as exc:
            log.warning(
                "broker_unreachable",
                bootstrap=app.settings.bootstrap,
                attempt=attempt,
                retry_in_s=delay_s,
                error=str(exc),
            )
            if await wait_set(stop, delay_s):
                return False
            delay_s = min(delay_s * 2, BROKER_RETRY_MAX_S)
            continue
        if attempt > 1:
            log.info("broker_reachable", bootstrap=app.settings.bootstrap, attempts=attempt)
        return True
    raise AssertionError("unreachable")  # pragma: no cover


def worker_command(
    *,
    app: Annotated[str, typer.Option(help="The App to serve, as module:attribute.")],
    queues: Annotated[
        str | None, typer.Option(help="Comma-separated queues; default: those of the app's tasks.")
    ] = None,
    pool: Annotated[str, typer.Option(help="Worker pool: consumer group <ns>.workers.<pool>.")] = (
        "default"
    ),
    concurrency: Annotated[int, typer.Option(min=1, help="Attempts run at once.")] = 10,
    lease_s: Annotated[
        float, typer.Option(min=0.01, help="Run lease, renewed every third of it.")
    ] = 30.0,
    grace_s: Annotated[
        float, typer.Option(min=0, help="On SIGTERM, how long running attempts may finish.")
    ] = 30.0,
    start_lookback_s: Annotated[
        float,
        typer.Option(
            min=0, help="A pool new to a dispatch partition starts at its records of this long ago."
        ),
    ] = START_LOOKBACK_MS / 1000,
    metrics_port: Annotated[int | None, metrics_port_option("EVSCHED_WORKER_METRICS_PORT")] = None,
    metrics_addr: MetricsAddr = "127.0.0.1",
    log_json: Annotated[bool, typer.Option("--log-json/--log-console")] = True,
) -> None:
    """Run the tasks of an evsched App from its dispatch queues."""
    configure_logging(json=log_json)
    try:
        loaded = load_app(app)  # an App made at import reads its settings from the environment
    except SettingsError as exc:
        typer.echo(f"evsched worker: {exc}", err=True)  # names the variable; no traceback
        raise typer.Exit(2) from None
    listed = tuple(q.strip() for q in (queues or "").split(",") if q.strip())
    config = WorkerConfig(
        queues=listed or loaded.queues,
        pool=pool,
        concurrency=concurrency,
        lease_ms=round(lease_s * 1000),
        grace_s=grace_s,
        start_lookback_ms=round(start_lookback_s * 1000),
    )
    dispatch_key = load_dispatch_key("worker")
    instruments = None
    if metrics_port is not None:
        instruments = WorkerInstruments()
        serve_metrics(instruments.registry, metrics_port, metrics_addr)
    worker = kafka_worker(loaded, config, instruments, dispatch_key)
    try:
        asyncio.run(serve_when_reachable(worker))
    except EvschedError as exc:  # a misconfigured topic, or the consumer that could not start
        typer.echo(f"evsched worker: {exc}", err=True)
        raise typer.Exit(1) from exc
    if worker.lingering:
        # Threads can't be killed, and Python waits for them at exit; an async handler that
        # ignored cancellation would hold the process as well: leave without them.
        log.warning("worker_exit_abandoning_handlers", handlers=worker.lingering)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


def load_dispatch_key(process: str) -> DispatchKey | None:
    """The dispatch key from the environment, or exit 2 with one line saying what is missing."""
    try:
        key = dispatch_key_from_env()
    except EvschedError as exc:
        typer.echo(f"evsched {process}: {exc}", err=True)
        raise typer.Exit(2) from exc
    if key is None:
        log.warning("dispatch_unsigned", process=process, reason=f"{UNSIGNED_ENV} is set")
    return key


async def serve_when_reachable(worker: Worker) -> None:
    """Wait for the broker (and the pool's topics), then serve; SIGTERM or SIGINT stop either."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    try:
        reachable = await wait_for_broker(worker.app, worker.config, stop)
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)
    if reachable:
        await serve(worker)
