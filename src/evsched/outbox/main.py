"""The relay as a process: signals, its metrics server, then relaying until SIGTERM or SIGINT."""

from __future__ import annotations

import asyncio
import signal

from evsched.adapters.kafka.event_log_choice import event_log_factory
from evsched.adapters.kafka.topics import Topics
from evsched.metrics import RelayInstruments, serve_metrics
from evsched.outbox.relay import Relay, RelayConfig
from evsched.settings import Settings


async def serve_relay(
    config: RelayConfig,
    settings: Settings,
    *,
    metrics_port: int | None = None,
    metrics_addr: str = "127.0.0.1",
) -> None:
    """Relay ``config.table`` to the namespace's events topic until SIGTERM or SIGINT."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    instruments = RelayInstruments()
    relay = Relay(
        config,
        event_log_factory(settings, client_id="evsched-relay"),
        Topics(settings.namespace).events,
        instruments,
    )
    if metrics_port is not None:
        serve_metrics(
            instruments.registry,
            metrics_port,
            metrics_addr,
            readiness=lambda: (True, "leading" if relay.leading else "standing by"),
        )
    await relay.run(stop)
