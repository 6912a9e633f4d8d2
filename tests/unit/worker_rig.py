"""The in-memory rig the worker's unit tests share: an app, a log and a dispatch feed."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from typing import Any

from evsched.adapters.clock import SYSTEM_CLOCK
from evsched.adapters.signing import DispatchKey
from evsched.client import App
from evsched.core.dispatch import Dispatch
from evsched.core.events import AttemptFailed, AttemptSnoozed, AttemptSucceeded, Event
from evsched.metrics import WorkerInstruments
from evsched.ports import Clock
from evsched.runtime.worker.worker import Worker, WorkerConfig
from evsched.settings import Settings
from evsched.testing import MemoryFeed, MemoryLog

NS = "unit"
EVENTS = f"{NS}.events"


@dataclass
class Rig:
    app: App
    log: MemoryLog
    feed: MemoryFeed
    serial: int = 0

    def dispatch(self, task: str, *args: Any, **fields: Any) -> Dispatch:
        self.serial += 1
        base = Dispatch(
            job_id=f"job-{self.serial}",
            token=10 + self.serial,
            attempt=1,
            max_attempts=3,
            task=task,
            queue="default",
            args=json.dumps({"args": list(args), "kwargs": {}}).encode(),
            timeout_ms=5_000,
            lease_ms=30_000,
            run_at=0,
            enqueued_at=0,
            leased_at=SYSTEM_CLOCK.now_ms(),
            partition=0,
        )
        return replace(base, **fields)

    def send(
        self, task: str, *args: Any, signed_by: DispatchKey | None = None, **fields: Any
    ) -> Dispatch:
        dispatch = self.dispatch(task, *args, **fields)
        self.feed.put_dispatch(dispatch, signed_by=signed_by)
        return dispatch

    def events_of(self, job_id: str, *kinds: type[Event]) -> list[Any]:
        return [e for e in self.log.events(*kinds) if getattr(e, "job_id", None) == job_id]

    async def outcome(self, job_id: str, timeout_s: float = 5.0) -> Any:
        kinds = (AttemptSucceeded, AttemptFailed, AttemptSnoozed)
        await self.log.wait_for(
            lambda _: bool(self.events_of(job_id, *kinds)),
            timeout_s=timeout_s,
            what=f"an outcome of {job_id}",
        )
        (event,) = self.events_of(job_id, *kinds)
        return event

    @asynccontextmanager
    async def worker(
        self,
        *,
        clock: Clock = SYSTEM_CLOCK,
        reader: Any = None,
        instruments: WorkerInstruments | None = None,
        dispatch_key: DispatchKey | None = None,
        follow: Any = None,
        **config: Any,
    ) -> AsyncIterator[Worker]:
        settings = {"queues": ("default",), "worker_id": "w1", "poll_s": 0.05, **config}
        worker = Worker(
            self.app,
            WorkerConfig(**settings),
            feed=self.feed,
            events=self.log,
            clock=clock,
            reader=reader,
            instruments=instruments,
            dispatch_key=dispatch_key,
            follow=follow,
        )
        running = asyncio.create_task(worker.run())
        try:
            yield worker
        finally:
            worker.stop()
            worker.stop()
            await asyncio.wait_for(running, 5)


def make_rig() -> Rig:
    log = MemoryLog()
    app = App(Settings(namespace=NS), name="unit", log_factory=lambda: log)
    return Rig(app, log, MemoryFeed(f"{NS}.dispatch.default"))


async def until(holds: Callable[[], bool], what: str, timeout_s: float = 5.0) -> None:
    """Poll ``holds`` until true; fail naming ``what`` after ``timeout_s``."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not holds():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"not within {timeout_s} s: {what}")
        await asyncio.sleep(0.01)
