"""What a generated request must also be to be valid, beyond what the OpenAPI document can say.

Some rules rest on run-time facts: a queue must be one an operator declared (``GET /v1/queues``),
``run_at`` must lie within a year before and 10 years after the API's clock, a ``cursor`` must
be a ``next_cursor`` this API handed out, an ``as_of`` a point its log holds (not in the
future), a ``timezone`` one its zone database knows, and a ``cron`` expression must parse (a
grammar no schema pattern states). Two more the document
cannot state exactly: a retry's ``initial_backoff_ms`` at most its ``max_backoff_ms`` (JSON
Schema does not compare two fields), and a priority within -(2^63 - 1)..2^63 - 1 (FastAPI's
OpenAPI model stores bounds as doubles, which round both to 2^63). The document states each in
words; this hook makes every *positive* case (one schemathesis means to be valid) true to them,
so ``positive_data_acceptance`` judges all the rest. Negative cases are left as generated.

``test_api_schema.py`` imports it; for the CLI: ``SCHEMATHESIS_HOOKS=tests.unit.api.schema_hooks
st run http://127.0.0.1:8080/openapi.json --checks all``.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import available_timezones

import schemathesis

from evsched.adapters.clock import now_ms
from evsched.adapters.kafka.log_cut import AtTime, CutError, parse_cut
from evsched.api.errors import ApiError
from evsched.api.listing import Cursor
from evsched.api.models import INT64_MAX
from evsched.core.schedule.cron import InvalidSchedule, validate
from tests.unit.api.test_api_twin import QUEUES

# Inside the API's window (commands.MAX_BEHIND / MAX_AHEAD) with a day to spare either side.
BEHIND = timedelta(days=365)
AHEAD = timedelta(days=3652)


@schemathesis.hook
def map_case(context: schemathesis.HookContext, case: Any) -> Any:
    meta = case.meta
    if meta is None or not meta.generation.mode.is_positive:
        return case
    body = case.body
    if isinstance(body, dict):
        jobs = body.get("jobs")
        for job in jobs if isinstance(jobs, list) else [body]:
            if isinstance(job, dict):
                _declared_queue(job)
                _run_at_in_window(job)
                _backoff_in_order(job)
                _priority_in_int64(job)
                _known_zone(job)
                _parsed_cron(job)
    if isinstance(case.query, dict) and isinstance(case.query.get("cursor"), str):
        case.query["cursor"] = _handed_out(case.query["cursor"])
    if isinstance(case.query, dict) and isinstance(case.query.get("as_of"), str):
        case.query["as_of"] = _a_point_of_the_log(case.query["as_of"])
    return case


def _declared_queue(job: dict[str, Any]) -> None:
    queue = job.get("queue")
    if isinstance(queue, str) and queue not in QUEUES:
        job["queue"] = QUEUES[len(queue) % len(QUEUES)]


def _run_at_in_window(job: dict[str, Any]) -> None:
    text = job.get("run_at")
    if not isinstance(text, str):
        return
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        return
    now = datetime.fromtimestamp(now_ms() / 1000, UTC)
    if moment.tzinfo is not None and not now - BEHIND <= moment <= now + AHEAD:
        job["run_at"] = (now + timedelta(minutes=1)).isoformat()


def _backoff_in_order(job: dict[str, Any]) -> None:
    retry = job.get("retry")
    if not isinstance(retry, dict):
        return
    low, high = retry.get("initial_backoff_ms"), retry.get("max_backoff_ms")
    if isinstance(low, int | float) and isinstance(high, int | float) and low > high:
        retry["initial_backoff_ms"], retry["max_backoff_ms"] = high, low


def _priority_in_int64(job: dict[str, Any]) -> None:
    priority = job.get("priority")
    if isinstance(priority, int) and abs(priority) > INT64_MAX:
        job["priority"] = INT64_MAX if priority > 0 else -INT64_MAX


def _known_zone(job: dict[str, Any]) -> None:
    zone = job.get("timezone")
    if isinstance(zone, str) and zone not in available_timezones():
        job["timezone"] = "UTC"


def _parsed_cron(job: dict[str, Any]) -> None:
    cron = job.get("cron")
    if not isinstance(cron, str):
        return
    try:
        validate(cron, "UTC")
    except InvalidSchedule:
        job["cron"] = "*/5 * * * *"


def _a_point_of_the_log(text: str) -> str:
    """``text`` if it names a point of the log that can be folded to, else one that does: a
    past time (before every record of the twin's log: folded to nothing) or no offset."""
    try:
        cut = parse_cut(text)
    except CutError:
        return "2020-01-01T00:00:00Z" if len(text) % 2 else "-1"
    if isinstance(cut, AtTime) and not 0 <= cut.at_ms <= now_ms():
        return "2020-01-01T00:00:00Z"
    return text if isinstance(cut, AtTime) else "-1"


def _handed_out(text: str) -> str:
    """``text`` if it is a cursor this API could have returned, else one that is (and fits the
    parameter's 2,000 characters: base64 makes 4 of every 3 bytes)."""
    try:
        Cursor.decode(text)
    except ApiError:
        return Cursor(0, text[:1_000] or None).encode()
    return text
