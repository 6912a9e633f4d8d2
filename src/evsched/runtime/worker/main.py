"""The worker process: wired to Kafka's adapters, waiting for the broker, and its command line."""

from __future__ import annotations

import asyncio
import signal

import structlog

from evsched.adapters.kafka.dispatch_feed import KafkaDispatchFeed
from evsched.adapters.kafka.event_log_choice import event_log_factory
from evsched.adapters.kafka.job_feed import KafkaJobFeed
from evsched.adapters.kafka.topics import ensure_namespace_topics
from evsched.adapters.signing import DispatchKey
from evsched.client.app import App
from evsched.metrics import WorkerInstruments
from evsched.runtime.process.startup import until_broker
from evsched.runtime.worker.worker import Worker, WorkerConfig, serve

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
    events = event_log_factory(app.settings, client_id=client_id)()
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


async def serve_when_reachable(worker: Worker) -> None:
    """Wait for the broker (and the pool's topics), then serve; SIGTERM or SIGINT stop either."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    try:
        reachable = await until_broker(
            lambda: _provisioned(worker),
            what="the pool's topics",
            stop=stop,
            first_s=BROKER_RETRY_FIRST_S,
            max_s=BROKER_RETRY_MAX_S,
        )
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)
    if reachable:
        await serve(worker)


async def _provisioned(worker: Worker) -> bool:
    """The pool's topics, waited for by until_broker (None would read as stopped)."""
    await ensure_worker_topics(worker.app, worker.config, timeout_s=BROKER_TRY_S)
    return True
