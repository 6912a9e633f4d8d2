"""Garbage-collector settings for evsched's long-running processes (node, worker, API, rebuild).

CPython's default generation-0 threshold (700 allocations) runs a young collection every few
events or jobs. In a folding process (no reference cycles, many short-lived frozen dataclasses)
that was about 7% of a node's fold time, for nothing. In a worker it costs pauses: a young
collection promotes whatever is in flight at that moment (attempts, pre-leased jobs waiting for
their ``run_at``, produce batches), and CPython collects the whole old generation whenever the
objects promoted since its last full collection pass a quarter of it. At a paced 500 jobs/s that
was 10-18 full collections in about a minute and a half of load, each holding the GIL for
60-408 ms on the busy two-core box (docs/bench-log.md, "The enqueue path under load"): every
job due meanwhile started that late.

So each process freezes what its imports allocated (the user's app, for a worker: never
scanned again), and collects young objects every 50,000 allocations. Memory stays bounded (at
most that many young objects wait for a collection) and cycles are still collected, less often.
``EVSCHED_GC_TUNING=off`` keeps CPython's defaults (to compare).
"""

from __future__ import annotations

import gc
import os
from collections.abc import Mapping

from evsched.settings import GC_TUNING_ENV, switch_env

YOUNG_THRESHOLD = 50_000


def tune_collector(environ: Mapping[str, str] | None = None) -> bool:
    """Freeze what imports allocated and collect young objects less often; call once at start,
    after the imports (a worker's app included). False when ``EVSCHED_GC_TUNING`` is off."""
    if not switch_env(os.environ if environ is None else environ, GC_TUNING_ENV):
        return False
    gc.collect()
    gc.freeze()
    gc.set_threshold(YOUNG_THRESHOLD, 50, 100)
    return True
