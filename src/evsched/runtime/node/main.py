"""The node as a process: signals, the metrics and readiness server, base topics, then the node.

Waits for a broker that is not up yet; a base topic evsched cannot use as it is ends the process
(the command line prints it in one line).
"""

from __future__ import annotations

import asyncio
import signal

from evsched.adapters.kafka.topics import ensure_namespace_topics
from evsched.metrics import serve_metrics
from evsched.runtime.node.metrics import NodeMetrics
from evsched.runtime.node.node import Node, NodeConfig
from evsched.runtime.process.allocator import tune_allocator
from evsched.runtime.process.gc_policy import tune_collector
from evsched.runtime.process.startup import until_broker

# How long one try at provisioning the base topics may take before it is retried.
PROVISION_TIMEOUT_S = 10.0


async def serve_node(config: NodeConfig) -> None:
    """Provision the base topics, run the node until SIGTERM or SIGINT, then close cleanly.

    Waits for an unreachable broker (retrying with a growing wait); raises TopicMisconfigured
    or TopicRefused when the base topics exist but cannot be used as they are.
    """
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    metrics = None if config.metrics_port is None else NodeMetrics.create()
    node = Node(config, metrics)
    if metrics is not None:
        assert config.metrics_port is not None
        serve_metrics(
            metrics.folded.registry,
            config.metrics_port,
            config.metrics_addr,
            readiness=node.health.readiness,
        )
    settings = config.settings

    async def provision() -> list[str]:
        return await ensure_namespace_topics(settings, queues=[], timeout_s=PROVISION_TIMEOUT_S)

    if await until_broker(provision, what="base topics", stop=stop) is None:
        return
    tune_collector()
    tune_allocator()
    await node.run(stop)
