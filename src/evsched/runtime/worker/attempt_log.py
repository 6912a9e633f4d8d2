"""An attempt's logger, bound to its job only when it first logs: most attempts never do.

Binding a structlog logger copies its context into a new logger; the worker bound one per
attempt (in the gate's caller, the runner and the heartbeat) for lines that only a failure, a
late start or a lost lease writes.
"""

from __future__ import annotations

from typing import Any

import structlog

from evsched.core.dispatch import Dispatch

log = structlog.get_logger("evsched.worker")


class AttemptLog:
    """Logs like ``log.bind(job_id=..., token=..., [task=...], [traceparent=...])``."""

    __slots__ = ("_bound", "_dispatch", "_with_task")

    def __init__(self, dispatch: Dispatch, *, with_task: bool = False) -> None:
        self._dispatch = dispatch
        self._with_task = with_task
        self._bound: Any = None

    @property
    def bound(self) -> Any:
        if self._bound is None:
            self._bound = log.bind(**self._fields())
        return self._bound

    def _fields(self) -> dict[str, Any]:
        d = self._dispatch
        fields: dict[str, Any] = {"job_id": d.job_id, "token": d.token}
        if self._with_task:
            fields["task"] = d.task
        if d.trace is not None:
            fields["traceparent"] = d.trace.traceparent
        return fields

    def debug(self, event: str, **fields: Any) -> None:
        # Without binding: below the configured level the call does nothing at all.
        if self._bound is None:
            log.debug(event, **self._fields(), **fields)
        else:
            self._bound.debug(event, **fields)

    def info(self, event: str, **fields: Any) -> None:
        self.bound.info(event, **fields)

    def warning(self, event: str, **fields: Any) -> None:
        self.bound.warning(event, **fields)

    def exception(self, event: str, **fields: Any) -> None:
        self.bound.exception(event, **fields)
