"""Replay checks: a recorded history folded with the current code and compared with its outcome.

A corpus entry is ``<name>.history.avro`` (an export) and ``<name>.expected.json``: for every
event, its verdict and the fields of the state it left (status, attempt, token, run_at,
lease_until for jobs; slots for schedules); for every job and schedule, its final fields and the
SHA-256 of its encoded final state; and a digest over all final states. The first divergence is
reported by entity, position and field. See ``replay/README.md``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, assert_never

from evsched.adapters import avro
from evsched.adapters.archive.history_file import LoggedEvent
from evsched.adapters.proofs import LogProofs, NodeKeyring
from evsched.core.controls import ControlState, target_of
from evsched.core.events import ControlEvent, Event, EventFamily, Position, entity_id
from evsched.core.fold import FOLD_VERSION, fold
from evsched.core.invariants import JobFold, Replay, Violation
from evsched.core.permits import LimitState, limit_name
from evsched.core.state import JobState, ScheduleState
from evsched.errors import DecodeError

FORMAT = "evsched.replay/1"
JOB_COLUMNS = (
    "partition",
    "offset",
    "kind",
    "verdict",
    "status",
    "attempt",
    "token",
    "run_at",
    "lease_until",
)
SCHEDULE_COLUMNS = (
    "partition",
    "offset",
    "kind",
    "verdict",
    "next_fire_at",
    "last_fire_at",
    "last_job_id",
    "deleted",
)
CONTROL_COLUMNS = ("partition", "offset", "kind", "verdict", "paused")
LIMIT_COLUMNS = ("partition", "offset", "kind", "verdict", "max_running", "waiting", "holders")
JOB_FINAL = ("status", "attempt", "token", "run_at", "sha256")
SCHEDULE_FINAL = ("next_fire_at", "last_fire_at", "deleted", "sha256")
CONTROL_FINAL = ("paused", "sha256")
LIMIT_FINAL = ("max_running", "holders", "sha256")


@dataclass(slots=True)
class Outcome:
    """What folding a history gave: per-entity rows in log order, final states, undecodables."""

    jobs: dict[str, list[list[Any]]] = field(default_factory=dict)
    schedules: dict[str, list[list[Any]]] = field(default_factory=dict)
    job_states: dict[str, JobState] = field(default_factory=dict)
    schedule_states: dict[str, ScheduleState] = field(default_factory=dict)
    # Pause switches, keyed "<target> <name> p<partition>": a queue's live on every partition.
    controls: dict[str, list[list[Any]]] = field(default_factory=dict)
    control_states: dict[str, ControlState] = field(default_factory=dict)
    # Queue limits, keyed "limit <queue> p<partition>" (core.permits).
    limits: dict[str, list[list[Any]]] = field(default_factory=dict)
    limit_states: dict[str, LimitState] = field(default_factory=dict)
    undecodable: list[list[int]] = field(default_factory=list)
    violations: list[Violation] = field(default_factory=list)
    events: int = 0

    def finals(self) -> dict[str, dict[str, Any]]:
        """Final fields of every job and schedule, keyed by id."""
        found = {k: _job_final(s) for k, s in self.job_states.items()}
        found.update({k: _schedule_final(s) for k, s in self.schedule_states.items()})
        found.update(
            {k: {"paused": s.paused, "sha256": _sha(s)} for k, s in self.control_states.items()}
        )
        found.update({k: _limit_final(s) for k, s in self.limit_states.items()})
        return found

    def states_digest(self) -> str:
        """SHA-256 over every final state's encoding, in id order."""
        digest = hashlib.sha256()
        states: dict[str, JobState | ScheduleState] = {**self.job_states, **self.schedule_states}
        for key in sorted(states):
            digest.update(key.encode() + b"\x00" + avro.encode_state(states[key]) + b"\x00")
        return digest.hexdigest()


def _limit_final(state: LimitState) -> dict[str, Any]:
    return {"max_running": state.max_running, "holders": list(state.holders), "sha256": _sha(state)}


def _sha(state: JobState | ScheduleState | ControlState | LimitState) -> str:
    return hashlib.sha256(avro.encode_state(state)).hexdigest()


def _job_final(state: JobState) -> dict[str, Any]:
    return {
        "status": state.status.value,
        "attempt": state.attempt,
        "token": state.token,
        "run_at": state.run_at,
        "sha256": _sha(state),
    }


def _schedule_final(state: ScheduleState) -> dict[str, Any]:
    return {
        "next_fire_at": state.next_fire_at,
        "last_fire_at": state.last_fire_at,
        "deleted": state.deleted,
        "sha256": _sha(state),
    }


def fold_history(
    events: Iterable[LoggedEvent],
    *,
    fold_job: JobFold = fold,
    keyring: NodeKeyring | None = None,
) -> Outcome:
    """Fold a history (any order; folded by partition and offset) with ``fold_job``.

    Proofs of role (core.roles) are checked with ``keyring``; without it none is required.
    """
    replay = Replay(fold_job=fold_job)
    outcome = Outcome()
    skipped: list[LoggedEvent] = []
    for logged, event, position in positioned(events, keyring, skipped=skipped):
        outcome.events += 1
        entry = replay.feed(event, position)
        key = entity_id(event)
        head = [logged.partition, logged.offset, entry.kind, entry.verdict.value]
        match event.family:
            case EventFamily.JOB | EventFamily.PERMIT:
                outcome.jobs.setdefault(key, []).append(head + _job_row(replay.jobs.get(key)))
            case EventFamily.SCHEDULE:
                outcome.schedules.setdefault(key, []).append(
                    head + _schedule_row(replay.schedules.get(key))
                )
            case EventFamily.CONTROL:
                _control_row(outcome, replay, head, event, logged.partition)
            case EventFamily.LIMIT:
                _limit_row(outcome, replay, head, limit_name(event), logged.partition)
            case _:
                assert_never(event.family)
    outcome.undecodable = [[logged.partition, logged.offset] for logged in skipped]
    outcome.events += len(skipped)
    outcome.job_states = replay.jobs
    outcome.schedule_states = replay.schedules
    outcome.violations = replay.finish().violations
    return outcome


def positioned(
    events: Iterable[LoggedEvent],
    keyring: NodeKeyring | None,
    *,
    skipped: list[LoggedEvent] | None = None,
    wanted: Callable[[LoggedEvent], bool] | None = None,
    in_order: bool = False,
) -> Iterator[tuple[LoggedEvent, Event, Position]]:
    """The decodable records of a history by (partition, offset), each with the position the
    fold judges it at (its proof of role checked with ``keyring``); the undecodable ones are
    added to ``skipped``.

    ``wanted``: only the records it accepts are decoded and yielded (the others are still
    positioned when the proofs of their partition need them). ``in_order``: ``events`` already
    come by (partition, offset), and are walked as they come instead of sorted in memory.
    """
    proofs = LogProofs(keyring)
    for logged in events if in_order else sorted(events, key=lambda e: (e.partition, e.offset)):
        want = wanted is None or wanted(logged)
        # A partition requires proofs from its first proven record on, whoever it concerns.
        if not want and (logged.proof is None or proofs.required(logged.partition)):
            continue
        try:
            event = avro.decode_event(logged.value)
        except DecodeError:
            if want and skipped is not None:
                skipped.append(logged)
            continue
        position = proofs.partition(logged.partition).position(
            partition=logged.partition,
            offset=logged.offset,
            log_at=logged.log_at,
            event=event,
            value=logged.value,
            proof=logged.proof,
        )
        if want:
            yield logged, event, position


def _control_row(
    outcome: Outcome, replay: Replay, head: list[Any], event: ControlEvent, partition: int
) -> None:
    target, name = target_of(event)
    control_key = control_name(target, name, partition)
    state = replay.controls.get((partition, target, name))
    outcome.controls.setdefault(control_key, []).append(
        [*head, None if state is None else state.paused]
    )
    if state is not None:
        outcome.control_states[control_key] = state


def _limit_row(
    outcome: Outcome, replay: Replay, head: list[Any], name: str, partition: int
) -> None:
    key = f"limit {name} p{partition}"
    state = replay.limits.get((partition, name))
    if state is None:
        row = [*head, None, None, None]
    else:
        row = [*head, state.max_running, [w.job_id for w in state.waiting], list(state.holders)]
        outcome.limit_states[key] = state
    outcome.limits.setdefault(key, []).append(row)


def control_name(target: str, name: str, partition: int) -> str:
    """A pause switch's key in an outcome: a queue has one per partition."""
    return f"{target} {name} p{partition}"


def _job_row(state: JobState | None) -> list[Any]:
    if state is None:
        return [None, None, None, None, None]
    return [state.status.value, state.attempt, state.token, state.run_at, state.lease_until]


def _schedule_row(state: ScheduleState | None) -> list[Any]:
    if state is None:
        return [None, None, None, None]
    return [state.next_fire_at, state.last_fire_at, state.last_job_id, state.deleted]


# --- the expected outcome file ------------------------------------------------------------------


def expected_document(outcome: Outcome, *, history: str, description: str) -> dict[str, Any]:
    """The recorded outcome of a history, as stored in ``<name>.expected.json``."""
    finals = outcome.finals()
    return {
        "format": FORMAT,
        "history": history,
        "description": description,
        "fold_version": FOLD_VERSION,
        "events": outcome.events,
        "states_digest": outcome.states_digest(),
        "job_columns": list(JOB_COLUMNS),
        "schedule_columns": list(SCHEDULE_COLUMNS),
        "jobs": {
            k: {"final": finals.get(k), "events": rows} for k, rows in sorted(outcome.jobs.items())
        },
        "schedules": {
            k: {"final": finals.get(k), "events": rows}
            for k, rows in sorted(outcome.schedules.items())
        },
        **_controls_section(outcome, finals),
        **_limits_section(outcome, finals),
        "undecodable": outcome.undecodable,
        "violations": [violation_row(v) for v in outcome.violations],
    }


def _controls_section(outcome: Outcome, finals: dict[str, Any]) -> dict[str, Any]:
    """Only histories with pauses or resumes have the section: older outcomes stay as recorded."""
    if not outcome.controls:
        return {}
    return {
        "control_columns": list(CONTROL_COLUMNS),
        "controls": {
            k: {"final": finals.get(k), "events": rows}
            for k, rows in sorted(outcome.controls.items())
        },
    }


def _limits_section(outcome: Outcome, finals: dict[str, Any]) -> dict[str, Any]:
    """Only histories with queue limits have the section."""
    if not outcome.limits:
        return {}
    return {
        "limit_columns": list(LIMIT_COLUMNS),
        "limits": {
            k: {"final": finals.get(k), "events": rows}
            for k, rows in sorted(outcome.limits.items())
        },
    }


def violation_row(v: Violation) -> list[Any]:
    return [v.invariant, v.job_id, v.partition, v.offset, v.detail]


def dump_expected(document: dict[str, Any]) -> str:
    """Deterministic JSON with one line per job or schedule, so a diff shows which ones changed."""
    lines = ["{"]
    keys = sorted(document)
    for i, key in enumerate(keys):
        comma = "," if i < len(keys) - 1 else ""
        value = document[key]
        if key in ("jobs", "schedules", "controls", "limits") and value:
            inner = [f"  {json.dumps(k)}: {_compact(v)}" for k, v in value.items()]
            body = "{\n" + ",\n".join(f"  {line}" for line in inner) + "\n  }"
            lines.append(f"  {json.dumps(key)}: {body}{comma}")
        else:
            lines.append(f"  {json.dumps(key)}: {_compact(value)}{comma}")
    return "\n".join(lines) + "\n}\n"


def _compact(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def expected_path(history: Path) -> Path:
    """``<name>.expected.json`` next to ``<name>.history.avro``."""
    name = history.name.removesuffix(".avro").removesuffix(".history")
    return history.with_name(f"{name}.expected.json")
