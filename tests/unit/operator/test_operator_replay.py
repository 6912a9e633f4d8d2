"""A recorded outcome is what the fold made of a history; a replay names the first place where the
current fold makes something else of it: which job, which offset, which field."""

from __future__ import annotations

import json
from dataclasses import replace
from functools import cache
from typing import Any

import pytest

from evsched.adapters.archive.history_file import LoggedEvent
from evsched.core import retry
from evsched.core.events import AttemptSucceeded, JobEvent, Position, RetryPolicy
from evsched.core.fold import fold
from evsched.core.state import JobState, Status, TimelineEntry, Verdict
from evsched.operator.replay import dump_expected, expected_document, fold_history
from evsched.operator.replay_check import compare
from tests.unit.operator.test_operator_audit import Story, enq, expire, fail, lease, ok, start


@cache
def _history() -> tuple[LoggedEvent, ...]:
    story = Story()
    story.add(enq("a"))
    story.add(lease("a", 1, 1))
    story.add(start("a", 1))
    story.add(fail("a", 1))
    story.add(lease("a", 2, 2), after_ms=2_000)
    story.add(start("a", 2))
    story.add(ok("a", 2))
    story.add(enq("b"))
    story.add(lease("b", 1, 1))
    story.add(start("b", 1))
    story.add(expire("b", 1), after_ms=3_000)
    story.add(ok("b", 1))  # its worker comes back after the expiry: stale
    story.add(b"junk")
    return tuple(LoggedEvent.from_record(r) for r in story.records)


def history() -> list[LoggedEvent]:
    """The same events (ids included) at every call."""
    return list(_history())


def recorded() -> dict[str, Any]:
    document = expected_document(fold_history(history()), history="h", description="test")
    loaded: dict[str, Any] = json.loads(dump_expected(document))
    return loaded


def test_the_same_fold_gives_the_recorded_outcome() -> None:
    expected = recorded()
    assert compare(expected, fold_history(history())).identical
    assert expected["events"] == 13 and expected["undecodable"] == [[0, 12]]
    assert expected["jobs"]["a"]["final"]["status"] == "succeeded"
    assert [row[3] for row in expected["jobs"]["b"]["events"]][-1] == "stale"


def test_dumped_outcomes_are_deterministic_json_with_a_line_per_job() -> None:
    text = dump_expected(expected_document(fold_history(history()), history="h", description=""))
    assert text == dump_expected(
        expected_document(fold_history(reversed(history())), history="h", description="")
    )
    assert sum(1 for line in text.splitlines() if line.startswith('    "a": ')) == 1


def test_another_backoff_policy_diverges_at_the_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    expected = recorded()
    real = retry.backoff_ms
    monkeypatch.setattr(retry, "backoff_ms", lambda p, j, a: 3 * real(p, j, a))

    comparison = compare(expected, fold_history(history()))
    first = comparison.first
    assert first is not None
    assert (first.entity_id, first.offset, first.kind, first.field) == (
        "a",
        3,
        "AttemptFailed",
        "run_at",
    )
    assert first.actual - first.expected == 2 * real(RetryPolicy(), "a", 1)
    assert "(AttemptFailed): run_at expected" in first.describe()


def zombie_friendly(
    state: JobState | None, event: JobEvent, position: Position
) -> tuple[JobState | None, TimelineEntry]:
    """A broken fold that lets a stale success through."""
    new, entry = fold(state, event, position)
    if isinstance(event, AttemptSucceeded) and entry.verdict is not Verdict.APPLIED and state:
        done = replace(state, status=Status.SUCCEEDED, result=event.result)
        return done, replace(entry, verdict=Verdict.APPLIED, status_after=Status.SUCCEEDED)
    return new, entry


def test_a_fold_that_accepts_stale_completions_diverges_on_the_verdict() -> None:
    first = compare(recorded(), fold_history(history(), fold_job=zombie_friendly)).first
    assert first is not None
    assert (first.entity_id, first.offset, first.field) == ("b", 11, "verdict")
    assert (first.expected, first.actual) == ("stale", "applied")


def test_missing_events_and_undecodables_are_divergences_too() -> None:
    expected = recorded()
    fewer = [e for e in history() if e.offset not in (6, 12)]
    found = compare(expected, fold_history(fewer))
    fields = {(d.entity_id, d.field) for d in found.divergences}
    assert ("a", "events") in fields
    assert ("(undecodable)", "verdict") in fields


def test_a_changed_final_state_outside_the_rows_is_caught_by_its_digest() -> None:
    expected = recorded()
    expected["jobs"]["a"]["final"]["sha256"] = "0" * 64
    first = compare(expected, fold_history(history())).first
    assert first is not None and first.field == "final state (encoded)" and first.entity_id == "a"
