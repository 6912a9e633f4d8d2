"""The worker: takes dispatch records and runs their attempts within a concurrency limit."""

from __future__ import annotations

import asyncio
import os
import secrets
import signal
import socket
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import structlog

from evsched.adapters.clock import SYSTEM_CLOCK
from evsched.adapters.kafka.dispatch_feed import START_LOOKBACK_MS
from evsched.adapters.signing import DispatchKey
from evsched.client.app import App
from evsched.core.bounds import MAX_PRELEASE_MS
from evsched.core.dispatch import Dispatch
from evsched.errors import EvschedError
from evsched.metrics import WorkerInstruments
from evsched.ports import Clock, DispatchFeed, EventLog, JobFeed, JobReader, Record
from evsched.runtime.worker.attempt import AttemptRunner
from evsched.runtime.worker.attempt_log import AttemptLog
from evsched.runtime.worker.gate import DispatchGate
from evsched.runtime.worker.handler_loop import BLOCKED_AFTER_S, HandlerLoop, ThreadCount
from evsched.runtime.worker.log_clock import LogClock

log = structlog.get_logger("evsched.worker")
RUN_AT_CHECK_S = 1.0
# After the grace period: how long cancelled attempts (and their handlers) get to wind down.
CANCEL_WAIT_S = 2.0


def default_worker_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerConfig:
    """How a worker runs; ``lease_ms`` is its run lease, renewed every third of it."""

    queues: tuple[str, ...]
    pool: str = "default"
    concurrency: int = 10
    lease_ms: int = 30_000
    grace_s: float = 30.0
    poll_s: float = 0.5
    blocked_after_s: float = BLOCKED_AFTER_S
    start_lookback_ms: int = START_LOOKBACK_MS
    worker_id: str = field(default_factory=default_worker_id)

    def __post_init__(self) -> None:
        if not self.queues:
            raise EvschedError("a worker needs at least one queue")
        if self.concurrency < 1 or self.lease_ms < 10 or self.grace_s < 0:
            raise EvschedError("a worker needs concurrency >= 1, lease_ms >= 10 and grace_s >= 0")
        if self.start_lookback_ms < 0 or self.blocked_after_s <= 0:
            raise EvschedError("a worker needs start_lookback_ms >= 0 and blocked_after_s > 0")


class Worker:
    """Runs an App's tasks from dispatch records until ``stop()``; see DESIGN.md section 5."""

    def __init__(
        self,
        app: App,
        config: WorkerConfig,
        *,
        feed: DispatchFeed,
        events: EventLog,
        clock: Clock = SYSTEM_CLOCK,
        reader: JobReader | None = None,
        instruments: WorkerInstruments | None = None,
        dispatch_key: DispatchKey | None = None,
        follow: JobFeed | None = None,
    ) -> None:
        self.app = app
        # Each running attempt follows its job on this feed, so a cancel reaches the handler.
        self._follow = follow
        self.config = config
        self._feed = feed
        self._events = events
        self._clock = clock
        self._reader = reader
        self._log_clock = LogClock()
        self._running: set[asyncio.Task[None]] = set()
        self._stopping = asyncio.Event()
        self._forced = asyncio.Event()
        self._slot_freed = asyncio.Event()
        self.peak_running = 0
        self.handled = 0  # records taken and judged: started and finished, or skipped
        self.threads = ThreadCount()
        self._instruments = instruments
        self.handlers = HandlerLoop(config.blocked_after_s)
        if instruments is not None:
            instruments.running.set_function(lambda: self.running)
            instruments.serving(config.queues)
        self._gate = DispatchGate(
            key=dispatch_key,
            clock=clock,
            reader=reader,
            on_skipped=None if instruments is None else instruments.skipped_dispatch,
        )

    @property
    def running(self) -> int:
        return len(self._running)

    def stop(self) -> None:
        """Stop taking work and let running attempts finish; called a second time, stop now."""
        if self._stopping.is_set():
            self._forced.set()
        self._stopping.set()
        self._slot_freed.set()

    async def run(self) -> None:
        """Run until stopped; returns once in-flight attempts finished or the grace ran out."""
        executor = ThreadPoolExecutor(self.config.concurrency, "evsched-handler")
        runner = AttemptRunner(
            worker_id=self.config.worker_id,
            lease_ms=self.config.lease_ms,
            events_topic=self.app.topics.events,
            log=self._events,
            clock=self._clock,
            executor=executor,
            handlers=self.handlers,
            reader=self._reader,
            feed=self._follow,
            threads=self.threads,
            log_clock=self._log_clock,
            on_finished=None if self._instruments is None else self._instruments.finished,
        )
        self.handlers.start()
        watchdog = asyncio.create_task(self.handlers.watch())
        try:
            await self._events.start()
            try:
                if self._follow is not None:
                    await self._follow.start()
                try:
                    await self._serve(runner)
                finally:
                    if self._follow is not None:
                        await self._follow.close()
            finally:
                await self._events.close()
        finally:
            watchdog.cancel()
            await self.handlers.close(CANCEL_WAIT_S)
            executor.shutdown(wait=False, cancel_futures=True)
        log.info("worker_stopped", worker_id=self.config.worker_id)

    async def _serve(self, runner: AttemptRunner) -> None:
        await self._feed.start()
        log.info("worker_started", worker_id=self.config.worker_id, queues=self.config.queues)
        try:
            await self._take_until_stopped(runner)
        finally:
            # Leave the group first, so the pool's other workers take over the partitions.
            await self._feed.close()
            await self._drain()

    @property
    def lingering(self) -> int:
        """Handlers still running after ``run()`` returned: threads, and async ones that
        ignored cancellation. The process has to exit without waiting for them."""
        return self.threads.busy + self.handlers.abandoned

    async def _take_until_stopped(self, runner: AttemptRunner) -> None:
        while not self._stopping.is_set():
            self._slot_freed.clear()
            free = self.config.concurrency - len(self._running)
            if free <= 0:
                await self._feed.take(0, 0)
                await wait_set(self._slot_freed, self.config.poll_s)
                continue
            for record in await self._take(free):
                self._spawn(runner, record)

    async def _take(self, free: int) -> list[Record]:
        """Records to run now; a stop interrupts the wait (what was not taken stays uncommitted)."""
        taking = asyncio.ensure_future(self._feed.take(free, self.config.poll_s))
        stopping = asyncio.ensure_future(self._stopping.wait())
        await asyncio.wait({taking, stopping}, return_when=asyncio.FIRST_COMPLETED)
        stopping.cancel()
        if not taking.done():
            taking.cancel()
            await asyncio.wait({taking})
            return []
        return taking.result()

    def _spawn(self, runner: AttemptRunner, record: Record) -> None:
        task = asyncio.create_task(self._handle(runner, record))
        self._running.add(task)
        self.peak_running = max(self.peak_running, len(self._running))
        task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._running.discard(task)
        self.handled += 1
        self._slot_freed.set()

    async def _handle(self, runner: AttemptRunner, record: Record) -> None:
        dispatch = await self._gate.admit(record)
        if dispatch is None:
            return
        logger = AttemptLog(dispatch)
        if not await self._wait_until(dispatch, logger) or not self._gate.in_time(dispatch):
            return
        try:
            await runner.run(dispatch, self.app.tasks.get(dispatch.task))
        except EvschedError as exc:
            # Nothing more to do here: the lease expires and the node leases the job again.
            logger.warning("attempt_abandoned", error=repr(exc))
        except Exception:
            logger.exception("attempt_crashed")

    async def _wait_until(self, dispatch: Dispatch, logger: AttemptLog) -> bool:
        """Never start before run_at (by the log's clock, as this worker measures it against its
        own from its appends); False to skip the dispatch."""
        run_at = dispatch.run_at
        while (ahead := run_at - self._log_clock.log_now(self._clock.now_ms())) > 0:
            if ahead > MAX_PRELEASE_MS:
                # No node pre-leases this far ahead: a far-off clock or a forged dispatch, which
                # would hold a slot for nothing.
                logger.warning("dispatch_not_due", run_at=run_at, ahead_ms=ahead)
                self._gate.skip(dispatch, "not_due")
                return False
            if await wait_set(self._stopping, min(ahead / 1000, RUN_AT_CHECK_S)):
                return False
        return True

    async def _drain(self) -> None:
        if not self._running:
            return
        log.info("worker_draining", running=len(self._running), grace_s=self.config.grace_s)
        deadline = asyncio.get_running_loop().time() + self.config.grace_s
        while self._running and not self._forced.is_set():
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                break
            forced = asyncio.ensure_future(self._forced.wait())
            await asyncio.wait(
                {*self._running, forced}, timeout=left, return_when=asyncio.FIRST_COMPLETED
            )
            forced.cancel()
        if self._running:
            # Unfinished attempts are recovered by lease expiry.
            log.warning("worker_grace_expired", abandoned=len(self._running))
            for task in self._running:
                task.cancel()
            await asyncio.wait(set(self._running), timeout=CANCEL_WAIT_S)


async def wait_set(event: asyncio.Event, timeout_s: float) -> bool:
    """Whether ``event`` got set within ``timeout_s``."""
    try:
        async with asyncio.timeout(timeout_s):
            await event.wait()
    except TimeoutError:
        return False
    return True


# --- the command line ---------------------------------------------------------------------------


async def serve(worker: Worker) -> None:
    """Run ``worker`` until SIGTERM or SIGINT (a second one cuts the grace period short)."""
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, worker.stop)
    try:
        await worker.run()
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)
