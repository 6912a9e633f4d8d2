"""Declared queues in the API: a request naming an undeclared queue is refused (422).

Requests name queues, but only an operator creates one (see ``adapters.kafka.queues``), so a request
can never make the cluster grow a topic. An unknown queue is a 422 naming ``queue`` from the
API, and a usage error from ``evsched enqueue`` and ``evsched schedules upsert``.
"""

from __future__ import annotations

import structlog

from evsched.adapters.kafka.queues import QueueCatalog, QueueLookupError, undeclared
from evsched.api.errors import ApiError
from evsched.metrics import Metrics

log = structlog.get_logger("evsched.api")


async def require_declared(catalog: QueueCatalog, queue: str, metrics: Metrics) -> None:
    """ApiError(422) naming ``queue`` unless it is declared; 503 when that cannot be told.

    Each refusal is counted and logged with the name, so attempts to invent queues show.
    """
    try:
        known = await catalog.declared(queue)
    except QueueLookupError as exc:
        raise ApiError(503, "broker_unavailable", str(exc)) from exc
    if not known:
        metrics.unknown_queue_refusals.inc()
        log.info("unknown_queue_refused", queue=queue)
        raise ApiError(422, "unknown_queue", undeclared(queue), field="queue")
