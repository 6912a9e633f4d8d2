"""Throughput of the projector's hot path on one core: decode an event, fold it, encode the state.

A seeded generator builds a realistic single-partition history (enqueues, leases, starts, a few
renewals and checkpoints, successes, failures with retries, permanent failures, expired leases,
some duplicates and zombie completions). It folds as it goes, so nearly every event is a valid
next step. All events are Avro-encoded before the clock starts. The timed loop then does, per
event, ``decode_event`` + ``fold`` + ``encode_state`` of the resulting state. The last line is
``events_per_s=<N>`` for scripts to read.

Run: ``.venv/bin/python bench/fold.py [--events 200000] [--seed 1] [--rounds 3] [--profile]``.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import random
import statistics
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from evsched.adapters.avro import decode_event, encode_event, encode_state
from evsched.core.events import (
    AttemptCheckpointed,
    AttemptFailed,
    AttemptStarted,
    AttemptSucceeded,
    Effect,
    Event,
    JobEnqueued,
    JobEvent,
    JobLeased,
    LeaseExpired,
    LeaseRenewed,
    Position,
    TraceContext,
)
from evsched.core.fold import fold
from evsched.core.state import TERMINAL_STATUSES, JobState, Status
from evsched.runtime.process.gc_policy import tune_collector

T0 = 1_767_225_600_000
IN_FLIGHT = 2_000  # jobs between enqueue and a terminal status at any moment
# A node's default dispatch timeout (core.planner.PlannerBudgets): a job waits a few seconds for
# its turn here, so a 5 s start deadline made most starts late, and the history a run of rejected
# starts (fold version 8 on refuses a start past its deadline).
DISPATCH_MS = 30_000
RUN_LEASE_MS = 30_000
TRACE = TraceContext(traceparent="00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")


@dataclass
class Generator:
    """Writes the history a busy partition would see, one plausible event at a time."""

    rng: random.Random
    now: int = T0
    states: dict[str, JobState] = field(default_factory=dict)
    active: list[str] = field(default_factory=list)
    abandoned: set[str] = field(default_factory=set)  # leased, but the worker never starts
    history: list[tuple[Event, Position]] = field(default_factory=list)

    def uid(self) -> str:
        return str(uuid.UUID(int=self.rng.getrandbits(128), version=4))

    def meta(self, job_id: str, source: str) -> dict[str, Any]:
        return {"event_id": self.uid(), "job_id": job_id, "emitted_at": self.now, "source": source}

    def emit(self, event: JobEvent) -> None:
        position = Position(partition=0, offset=len(self.history), log_at=self.now)
        self.history.append((event, position))
        state, _ = fold(self.states.get(event.job_id), event, position)
        if state is None:
            return
        self.states[event.job_id] = state
        if state.status in TERMINAL_STATUSES:
            self.active.remove(event.job_id)
            self.abandoned.discard(event.job_id)

    def step(self) -> None:
        self.now += self.rng.choice((0, 1, 1, 2, 3))
        if len(self.active) < IN_FLIGHT or self.rng.random() < 0.02:
            self.emit(self.enqueue())
            return
        for _ in range(8):  # a few jobs may not be due yet; then another one gets a turn
            event = self.next_for(self.rng.choice(self.active))
            if event is not None:
                self.emit(event)
                return
        self.emit(self.enqueue())

    def enqueue(self) -> JobEnqueued:
        job_id = self.uid()
        self.active.append(job_id)
        n = self.rng.randrange(10**6)
        return JobEnqueued(
            **self.meta(job_id, "api"),
            task="billing.send_invoice",
            queue="billing",
            args=b'{"invoice_id": %d, "customer": "c-%d", "channel": "email"}' % (n, n % 997),
            run_at=self.now + self.rng.choice((0, 0, 0, 50, 2_000)),
            max_attempts=3,
            idempotency_key=f"invoice-{n}" if n % 3 == 0 else None,
            labels={"team": "billing"},
            trace=TRACE if n % 2 else None,
        )

    def next_for(self, job_id: str) -> JobEvent | None:
        state = self.states[job_id]
        if state.status is Status.SCHEDULED:
            if self.now < state.run_at:
                return None
            if self.rng.random() < 0.03:
                self.abandoned.add(job_id)
            attempt = state.attempt + 1
            meta = self.meta(job_id, "node-1")
            return JobLeased(**meta, token=state.token + 1, attempt=attempt, lease_ms=DISPATCH_MS)
        if job_id in self.abandoned or self.start_too_late(state):
            return self.expire(state)
        if state.status is Status.LEASED:
            meta = self.meta(job_id, "worker-7")
            return AttemptStarted(
                **meta, token=state.token, worker_id="worker-7", lease_ms=RUN_LEASE_MS
            )
        return self.running(state)

    def start_too_late(self, state: JobState) -> bool:
        """A start would come past the lease's start deadline: the node expires the lease."""
        until = state.lease_until
        return state.status is Status.LEASED and until is not None and self.now >= until

    def expire(self, state: JobState) -> JobEvent | None:
        assert state.lease_until is not None
        if self.now < state.lease_until:
            return None
        self.abandoned.discard(state.job_id)
        return LeaseExpired(**self.meta(state.job_id, "node-1"), token=state.token)

    def running(self, state: JobState) -> JobEvent:
        meta = self.meta(state.job_id, "worker-7")
        roll = self.rng.random()
        if roll < 0.25:
            return LeaseRenewed(**meta, token=state.token, lease_ms=RUN_LEASE_MS)
        if roll < 0.30:
            return AttemptCheckpointed(**meta, token=state.token, checkpoint=b'{"page": 3}')
        if roll < 0.38:
            retryable = roll < 0.37
            return AttemptFailed(
                **meta,
                token=state.token,
                error_type="TimeoutError",
                message="smtp",
                retryable=retryable,
            )
        if roll < 0.39:  # a zombie from an older attempt: stale, or rejected when there is none
            return AttemptSucceeded(**meta, token=state.token - 1, result=b"{}")
        effect = Effect(kind="email.sent", payload=b'{"to": "c-5521"}')
        return AttemptSucceeded(
            **meta, token=state.token, result=b'{"sent": true}', effects=(effect,)
        )


def generate(events: int, seed: int) -> list[tuple[Event, Position]]:
    generator = Generator(rng=random.Random(seed))
    while len(generator.history) < events:
        generator.step()
    # A sprinkle of producer retries: the same bytes again, later in the log.
    history = generator.history
    for index in range(0, len(history), 97):
        event, _ = history[index]
        history.append((event, Position(partition=0, offset=len(history), log_at=generator.now)))
    return history


def project(encoded: list[tuple[bytes, Position]]) -> dict[str, JobState]:
    """The timed loop: what the projector does per event, minus RocksDB."""
    states: dict[str, JobState] = {}
    for data, position in encoded:
        event = decode_event(data)
        assert isinstance(event, JobEvent)
        state, _ = fold(states.get(event.job_id), event, position)
        if state is not None:
            states[event.job_id] = state
            encode_state(state)
    return states


def _timed(label: str, count: int, run: Callable[[], object]) -> float:
    start = time.perf_counter()
    run()
    rate = count / (time.perf_counter() - start)
    print(f"{label:<28} {rate:>10,.0f} events/s")
    return rate


def _stages(history: list[tuple[Event, Position]], encoded: list[tuple[bytes, Position]]) -> None:
    """Each stage alone, to see where the time goes."""
    n = len(history)
    _timed("decode_event only", n, lambda: [decode_event(data) for data, _ in encoded])
    states: dict[str, JobState] = {}
    folded: list[JobState] = []
    verdicts: Counter[str] = Counter()

    def fold_all() -> None:
        for event, position in history:
            assert isinstance(event, JobEvent)
            state, entry = fold(states.get(event.job_id), event, position)
            verdicts[entry.verdict] += 1
            if state is not None:
                states[event.job_id] = state
                folded.append(state)

    _timed("fold only", n, fold_all)
    _timed("encode_state only", len(folded), lambda: [encode_state(state) for state in folded])
    print("verdicts: " + ", ".join(f"{k}={v}" for k, v in sorted(verdicts.items())))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3, help="timed runs; the median is reported")
    parser.add_argument("--profile", action="store_true", help="cProfile the timed loop")
    args = parser.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # one core
    history = generate(args.events, args.seed)
    encoded = [(encode_event(event), position) for event, position in history]
    kinds = Counter(type(event).__name__ for event, _ in history)
    print(f"{len(history)} events: " + ", ".join(f"{k}={v}" for k, v in sorted(kinds.items())))
    # The history is setup, not workload: frozen with the imports, and the collector runs as it
    # does in a node (evsched.runtime.process.gc_policy).
    tune_collector()
    _stages(history, encoded)
    if args.profile:
        profiler = cProfile.Profile()
        profiler.runcall(project, encoded)
        pstats.Stats(profiler).sort_stats("tottime").print_stats(18)
    label = "decode + fold + encode_state"
    rates = [_timed(label, len(encoded), lambda: project(encoded)) for _ in range(args.rounds)]
    print(f"events_per_s={statistics.median(rates):.0f}")


if __name__ == "__main__":
    main()
