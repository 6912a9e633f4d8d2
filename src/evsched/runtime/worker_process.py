"""The worker process: wired to Kafka's adapters, waiting for the broker, and its command line."""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
import sys
from typing import Annotated

import structlog
import typer

from evsched.adapters.kafka_feed import START_LOOKBACK_MS, KafkaDispatchFeed
from evsched.adapters.kafka_log import KafkaEventLog
from evsched.adapters.signing import UNSIGNED_ENV, DispatchKey, dispatch_key_from_env
from evsched.adapters.topics import TopicMisconfigured, TopicProvisioningError, ensure_topics
from evsched.client.app import App
from evsched.client.loader import load_app
from evsched.errors import EvschedError
from evsched.logging import configure_logging
from evsched.metrics import MetricsAddr, WorkerInstruments, metrics_port_option, serve_metrics
from evsched.runtime.worker import (
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
