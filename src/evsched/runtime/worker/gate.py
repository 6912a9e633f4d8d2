"""What a worker checks before it starts a dispatch: authentic, decodable, current and in time."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

import structlog

from evsched.adapters.avro import decode_dispatch
from evsched.adapters.signing import DispatchKey
from evsched.core.dispatch import Dispatch, start_deadline, why_not_start
from evsched.core.state import TERMINAL_STATUSES
from evsched.errors import DecodeError
from evsched.ports import Clock, JobReader, Record

log = structlog.get_logger("evsched.worker")

# Jobs whose newest token a worker remembers; the oldest are forgotten first. 100k ids cost
# about 15 MB, and a duplicate older than that many dispatches is long past its deadline anyway.
REMEMBERED_JOBS = 100_000


class DispatchGate:
    """Lets through only dispatches a worker may start; every other one is logged and counted.

    Refused: records without a valid signature (when the worker holds a key), undecodable ones,
    duplicates and superseded tokens this worker has seen, dispatches past their start deadline,
    and (with a JobReader) jobs the projection shows finished or leased again since.
    """

    def __init__(
        self,
        *,
        key: DispatchKey | None,
        clock: Clock,
        reader: JobReader | None = None,
        on_skipped: Callable[[str], None] | None = None,
        remembered: int = REMEMBERED_JOBS,
    ) -> None:
        self._key = key
        self._clock = clock
        self._reader = reader
        self._on_skipped = on_skipped
        self._remembered = remembered
        self._newest: OrderedDict[str, int] = OrderedDict()

    async def admit(self, record: Record) -> Dispatch | None:
        """The record's dispatch when it may start (after its run_at), else None."""
        value = record.value or b""
        if self._key is not None:
            refused = self._key.check(record.topic, value, record.headers)
            if refused is not None:
                self._count(refused)
                log.warning("dispatch_unauthenticated", reason=refused, **_where(record))
                return None
        try:
            dispatch = decode_dispatch(value)
        except DecodeError as exc:
            self._count("undecodable")
            log.warning("dispatch_undecodable", reason=exc.reason, **_where(record))
            return None
        newest = self._newest.get(dispatch.job_id)
        self._remember(dispatch)
        why = why_not_start(dispatch, now_ms=self._clock.now_ms(), newest_token=newest)
        if why is None:
            why = await self._ask_reader(dispatch)
        if why is not None:
            self.skip(dispatch, why)
            return None
        return dispatch

    def in_time(self, dispatch: Dispatch) -> bool:
        """Whether an admitted dispatch may still start now (checked again after run_at)."""
        newest = self._newest.get(dispatch.job_id)
        seen = None if newest == dispatch.token else newest
        why = why_not_start(dispatch, now_ms=self._clock.now_ms(), newest_token=seen)
        if why is not None:
            self.skip(dispatch, why)
        return why is None

    def skip(self, dispatch: Dispatch, reason: str) -> None:
        self._count(reason)
        log.info(
            "dispatch_skipped",
            reason=reason,
            job_id=dispatch.job_id,
            token=dispatch.token,
            attempt=dispatch.attempt,
            start_deadline=start_deadline(dispatch),
            late_ms=max(0, self._clock.now_ms() - start_deadline(dispatch)),
        )

    def _remember(self, dispatch: Dispatch) -> None:
        newest = max(dispatch.token, self._newest.pop(dispatch.job_id, dispatch.token))
        self._newest[dispatch.job_id] = newest
        if len(self._newest) > self._remembered:
            self._newest.popitem(last=False)

    async def _ask_reader(self, dispatch: Dispatch) -> str | None:
        if self._reader is None:
            return None
        try:
            state = await self._reader.job(dispatch.job_id)
        except Exception as exc:  # the projection is an optimisation: the fold fences anyway
            log.warning("dispatch_reader_failed", job_id=dispatch.job_id, error=repr(exc))
            return None
        if state is None:
            return None
        if state.token > dispatch.token:
            return "superseded"
        if state.token == dispatch.token and state.status in TERMINAL_STATUSES:
            return "finished"
        return None

    def _count(self, reason: str) -> None:
        if self._on_skipped is not None:
            self._on_skipped(reason)


def _where(record: Record) -> dict[str, object]:
    return {"topic": record.topic, "partition": record.partition, "offset": record.offset}
