"""How operator commands print: rich tables for people, plain JSON documents for scripts."""

from __future__ import annotations

import base64
import dataclasses
import enum
import json
import sys
from collections.abc import Iterable
from typing import Any

from rich.console import Console
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

from evsched.adapters.payload import MAX_JSON_DEPTH, deeper_than
from evsched.core.controls import ControlState
from evsched.core.failures import category_of
from evsched.core.state import JobState, ScheduleState, Status, TimelineEntry, Verdict
from evsched.operator.audit import Audit
from evsched.operator.readings import iso

out = Console(highlight=False, soft_wrap=False)
err = Console(stderr=True, highlight=False)

STATUS_STYLE = {
    Status.SCHEDULED: "white",
    Status.LEASED: "blue",
    Status.RUNNING: "cyan",
    Status.SUCCEEDED: "green",
    Status.DEAD: "red",
    Status.CANCELLED: "yellow",
    Status.WAITING: "magenta",
}
VERDICT_STYLE = {
    Verdict.APPLIED: "green",
    Verdict.DUPLICATE: "dim",
    Verdict.CONFLICT: "magenta",
    Verdict.STALE: "yellow",
    Verdict.REJECTED: "red",
    Verdict.UNDECODABLE: "bold red",
}
_HEX_FIELDS = frozenset({"body_digest"})
_PREVIEW = 60


def emit_json(document: Any) -> None:
    """One JSON document on stdout, keys sorted, for ``--json``."""
    sys.stdout.write(json.dumps(document, indent=2, sort_keys=True, ensure_ascii=False) + "\n")


def payload(data: bytes | None) -> Any:
    """Stored bytes as JSON when they are JSON (args, results, checkpoints), else base64.

    JSON nested deeper than MAX_JSON_DEPTH (a foreign producer's) is shown as base64 too: the
    renderers walk values recursively.
    """
    if data is None:
        return None
    try:
        value = json.loads(data)
    except (UnicodeDecodeError, ValueError, RecursionError):
        return {"base64": base64.b64encode(data).decode()}
    if deeper_than(value, MAX_JSON_DEPTH):
        return {"base64": base64.b64encode(data).decode()}
    return value


def plain(value: Any, name: str = "") -> Any:
    """A dataclass (state, entry) as JSON-ready values; times stay epoch milliseconds."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name), f.name) for f in dataclasses.fields(value)}
    if isinstance(value, bytes):
        return value.hex() if name in _HEX_FIELDS else payload(value)
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, tuple | list):
        return [plain(item) for item in value]
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    return value


def entry_json(entry: TimelineEntry, reading: str) -> dict[str, Any]:
    document: dict[str, Any] = plain(entry)
    document.update(log_at_iso=iso(entry.log_at), reading=reading)
    return document


def audit_json(found: Audit) -> dict[str, Any]:
    return {
        "id": found.entity_id,
        "partition": found.partition,
        "applied_offset": found.applied_offset,
        "as_of": found.as_of,
        "state": None if found.state is None else plain(found.state),
        "events": [
            {**entry_json(row.entry, row.reading), "traceback": row.traceback} for row in found.rows
        ],
        "drifted_offsets": [row.entry.offset for row in found.drifted],
        "purged": None if found.purged is None else entry_json(found.purged, found.purged.reason),
    }


def status_text(status: Status) -> Text:
    return Text(status.value, style=STATUS_STYLE[status])


def verdict_text(verdict: Verdict) -> Text:
    return Text(verdict.value, style=VERDICT_STYLE[verdict])


def preview(data: bytes | None) -> str:
    if data is None:
        return ""
    text = json.dumps(payload(data), ensure_ascii=False, separators=(",", ":"))
    return text if len(text) <= _PREVIEW else text[: _PREVIEW - 1] + "…"


def job_table(state: JobState) -> Table:
    """One job, field by field."""
    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_column(style="bold")
    table.add_column()
    error = state.last_error
    rows: list[tuple[str, str | Text]] = [
        ("job", state.job_id),
        ("status", status_text(state.status)),
        ("task", f"{state.task} on queue {state.queue} (priority {state.priority})"),
        ("args", preview(state.args)),
        ("attempt", f"{state.attempt} of {state.max_attempts}"),
        ("token", str(state.token)),
        ("run_at", iso(state.run_at)),
        ("lease_until", iso(state.lease_until)),
        ("worker", state.worker_id or ""),
        ("enqueued_at", iso(state.enqueued_at)),
        ("updated_at", iso(state.updated_at)),
        ("idempotency_key", state.idempotency_key or ""),
        ("schedule", f"{state.schedule_id} @ {iso(state.fire_at)}" if state.schedule_id else ""),
        ("last_error", f"{error.error_type}: {error.message}" if error else ""),
        ("category", category_of(error) if error else ""),
        ("traceback", (error.traceback or "") if error else ""),
        ("result", preview(state.result)),
        ("checkpoint", preview(state.checkpoint)),
        ("partition", str(state.partition)),
    ]
    for name, value in rows:
        if value:
            table.add_row(name, value)
    return table


def jobs_table(states: Iterable[JobState], *, categories: bool = False) -> Table:
    """Jobs, one a row; with ``categories`` (the dead-letter listing) their failure category."""
    names = ["job", "status", "task", "queue", "attempt", "token", "run_at", "last error"]
    table = Table(*names, *(["category"] if categories else []))
    for s in states:
        error = f"{s.last_error.error_type}: {s.last_error.message}" if s.last_error else ""
        row: list[str | Text] = [
            s.job_id,
            status_text(s.status),
            s.task,
            s.queue,
            f"{s.attempt}/{s.max_attempts}",
        ]
        row += [str(s.token), iso(s.run_at), error[:_PREVIEW]]
        if categories:
            row.append(category_of(s.last_error) if s.last_error else "")
        table.add_row(*row)
    return table


# Below this width the audit's eight columns leave no room for the readings: list the events.
WIDE = 150


def print_audit(console: Console, found: Audit) -> None:
    """The audit as a table on a wide console, else one event per two lines."""
    if console.width >= WIDE:
        console.print(audit_table(found))
    else:
        _print_audit_narrow(console, found)
    for row in found.rows:
        if row.traceback:
            e = row.entry
            console.print(Text(f"traceback of {e.kind} at {e.partition}@{e.offset}:", style="bold"))
            console.print(Padding(Text(row.traceback), (0, 0, 0, 4), expand=False))


def _print_audit_narrow(console: Console, found: Audit) -> None:
    console.print(Text(_audit_title(found), style="bold"))
    for row in found.rows:
        e = row.entry
        token = "" if e.token is None else f"  token {e.token}"
        head = Text(f"{e.partition}@{e.offset}  {iso(e.log_at)}  {e.kind}  {e.source}{token}  ")
        head.append_text(verdict_text(e.verdict))
        console.print(head, overflow="fold")
        console.print(Padding(Text(row.reading), (0, 0, 0, 4), expand=False))


def _audit_title(found: Audit) -> str:
    title = f"{found.entity_id} on partition {found.partition}"
    if found.as_of is not None:
        title += f", as of offset {found.as_of}"
    return title


def audit_table(found: Audit) -> Table:
    """Every event of an audit: where, when, what, who, which token, the verdict and why."""
    table = Table(title=_audit_title(found))
    for name in ("p@offset", "log time", "kind", "source", "token", "verdict"):
        table.add_column(name, no_wrap=True)
    table.add_column("reading", min_width=30)
    for row in found.rows:
        e = row.entry
        table.add_row(
            f"{e.partition}@{e.offset}",
            iso(e.log_at),
            e.kind,
            e.source,
            "" if e.token is None else str(e.token),
            verdict_text(e.verdict),
            row.reading,
        )
    return table


def schedule_table(state: ScheduleState, switch: ControlState | None) -> Table:
    """One schedule, field by field; ``switch`` is its pause switch (None: never paused)."""
    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_column(style="bold")
    table.add_column()
    template = state.template
    paused = "" if switch is None or not switch.paused else f"since {iso(switch.changed_at)}"
    rows: list[tuple[str, str]] = [
        ("schedule", state.schedule_id + (" (deleted)" if state.deleted else "")),
        ("cron", f"{state.cron} ({state.timezone})"),
        ("paused", paused + (f" ({switch.reason})" if paused and switch and switch.reason else "")),
        ("task", f"{template.task} on queue {template.queue} (priority {template.priority})"),
        ("args", preview(template.args)),
        ("max_attempts", str(template.max_attempts)),
        ("timeout", f"{template.timeout_ms / 1000:g} s"),
        ("next slot", iso(state.next_fire_at)),
        ("last slot", iso(state.last_fire_at)),
        ("last job", state.last_job_id or ""),
        ("catch-up window", _ms(state.catchup_window_ms)),
        ("max jitter", _ms(state.max_jitter_ms)),
        ("overlap", state.overlap or ""),
        ("created_at", iso(state.created_at)),
        ("updated_at", iso(state.updated_at)),
    ]
    for name, value in rows:
        table.add_row(name, Text(value))  # ids and args are data, never markup
    return table


def _ms(value: int | None) -> str:
    return "" if value is None else f"{value:,} ms"


def schedules_table(schedules: Iterable[ScheduleState]) -> Table:
    table = Table("schedule", "cron", "timezone", "task", "queue", "next slot", "last slot", "job")
    for s in schedules:
        table.add_row(
            s.schedule_id + (" (deleted)" if s.deleted else ""),
            s.cron,
            s.timezone,
            s.template.task,
            s.template.queue,
            iso(s.next_fire_at),
            iso(s.last_fire_at),
            s.last_job_id or "",
        )
    return table
