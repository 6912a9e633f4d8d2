"""The worker process: wired to Kafka's adapters, waiting for the broker, and its command line."""

from __future__ import annotations

import asyncio
import itertools
import signal

import structlog

from evsched.adapters.kafka_feed import KafkaDispatchFeed
from evsched.adapters.kafka_follow import KafkaJobFeed
from evsched.adapters.kafka_log import KafkaEventLog
from evsched.adapters.signing import DispatchKey
from evsched.adapters.topics import (
    TopicMisconfigured,
    TopicProvisioningError,
    ensure_namespace_topics,
)
from evsched.client.app import App
from evsched.metrics import WorkerInstruments
from evsched.runtime.worker import (
    Worker,
    WorkerConfig,
    serve,
    wait_set,
)

log = structlog.get_logger("evsched.worker")
# While the broker is unreachable at start: the first retry after this, doubling up to the max.
BROKER_RETRY_FIRST_S = 0.5
BROKER_RETRY_MAX_S = 15.0
BROKER_TRY_S = 10.0


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
    feed = KafkaDispatchFeed.for_pool(
        app.settings,
        topics,
        group_id=group,
        client_id=client_id,
        start_lookback_ms=config.start_lookback_ms,
    )
    events = KafkaEventLog(app.settings, client_id=client_id)
    follow = KafkaJobFeed(app.settings, app.topics.events, client_id=f"{client_id}-follow")
    return Worker(
        app,
        config,
        feed=feed,
        events=events,
        instruments=instruments,
        dispatch_key=dispatch_key,
        follow=follow,
    )


async def ensure_worker_topics(app: App, config: WorkerConfig, timeout_s: float = 30.0) -> None:
    """Create the pool's dispatch topics if missing, as the node would (and check them).

    A consumer subscribed to a topic that does not exist yet only sees it at its next metadata
    refresh (minutes), so a worker started before the node would sit idle that long.
    """
    await ensure_namespace_topics(app.settings, queues=config.queues, timeout_s=timeout_s)


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
