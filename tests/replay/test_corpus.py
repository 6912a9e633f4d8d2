"""Every history in ``replay/`` folds to its recorded outcome with the current code, and a changed
fold (another backoff policy, a fold that lets a zombie's completion through) is caught."""

from __future__ import annotations

from dataclasses import replace
from functools import cache
from pathlib import Path

import pytest

from evsched.adapters.archive.history_file import read_history
from evsched.core import retry
from evsched.core.events import EVENT_TYPES, AttemptSucceeded, JobEvent, JobLeased, Position
from evsched.core.fold import fold
from evsched.core.state import JobState, Status, TimelineEntry, Verdict
from evsched.operator.commands.replay import check, keyring_for, load_expected
from evsched.operator.replay import Outcome, expected_path, fold_history
from evsched.operator.replay_check import compare

CORPUS = Path(__file__).resolve().parents[2] / "replay"
HISTORIES = sorted(CORPUS.glob("*.history.avro"))
MAX_CORPUS_BYTES = 5_000_000


@cache
def events(name: str) -> tuple[object, ...]:
    return tuple(read_history(CORPUS / f"{name}.history.avro").events)


def refold(name: str, **options: object) -> Outcome:
    return fold_history(events(name), **options)  # type: ignore[arg-type]


def test_the_corpus_holds_its_histories_and_stays_small() -> None:
    names = {path.name.removesuffix(".history.avro") for path in HISTORIES}
    assert names >= {"lifecycle", "workers", "cron"}
    assert all(expected_path(path).is_file() for path in HISTORIES)
    files = [*HISTORIES, *(expected_path(path) for path in HISTORIES)]
    assert sum(path.stat().st_size for path in files) < MAX_CORPUS_BYTES


@pytest.mark.parametrize("history", HISTORIES, ids=lambda path: path.name)
def test_each_history_folds_to_its_recorded_outcome(history: Path) -> None:
    checked = check(history)
    first = checked.comparison.first
    assert first is None, first.describe()
    assert checked.outcome.events > 0 and not checked.outcome.violations


def test_the_corpus_covers_every_verdict_and_event_kind() -> None:
    verdicts: set[str] = set()
    kinds: set[str] = set()
    for history in HISTORIES:
        expected = load_expected(expected_path(history))
        for section in ("jobs", "schedules", "controls", "limits"):
            for entity in expected.get(section, {}).values():
                verdicts.update(row[3] for row in entity["events"])
                kinds.update(row[2] for row in entity["events"])
        if expected["undecodable"]:
            verdicts.add(Verdict.UNDECODABLE.value)
    assert verdicts == {v.value for v in Verdict}
    assert kinds == {kind.__name__ for kind in EVENT_TYPES}


def test_another_backoff_policy_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    expected = load_expected(CORPUS / "lifecycle.expected.json")
    real = retry.backoff_ms
    monkeypatch.setattr(
        retry, "backoff_ms", lambda policy, job, attempt: real(policy, job, attempt) + 250
    )

    first = compare(expected, refold("lifecycle")).first
    assert first is not None
    assert first.kind in ("AttemptFailed", "LeaseExpired", "JobLeased")
    assert first.field in ("run_at", "verdict")


def zombie_friendly(
    state: JobState | None, event: JobEvent, position: Position
) -> tuple[JobState | None, TimelineEntry]:
    """A broken fold: a stale success goes through as if its token were current."""
    new, entry = fold(state, event, position)
    if isinstance(event, AttemptSucceeded) and entry.verdict is Verdict.STALE and state:
        done = replace(state, status=Status.SUCCEEDED, result=event.result)
        return done, replace(entry, verdict=Verdict.APPLIED, status_after=Status.SUCCEEDED)
    return new, entry


def test_a_fold_that_lets_a_zombie_commit_is_caught() -> None:
    expected = load_expected(CORPUS / "workers.expected.json")
    first = compare(expected, refold("workers", fold_job=zombie_friendly)).first
    assert first is not None
    assert (first.kind, first.field, first.expected, first.actual) == (
        "AttemptSucceeded",
        "verdict",
        "stale",
        "applied",
    )


def test_a_fold_that_ignores_a_paused_queue_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    from evsched.core import controls, invariants

    def unguarded(state, event, position, paused, base=fold):  # type: ignore[no-untyped-def]
        return controls.fold_job(state, event, position, frozenset(), base)

    expected = load_expected(CORPUS / "controls.expected.json")
    monkeypatch.setattr(invariants, "fold_job", unguarded)
    first = compare(expected, refold("controls")).first
    assert first is not None and first.kind == "JobLeased" and first.field == "verdict"


def takes_any_higher_token(
    state: JobState | None, event: JobEvent, position: Position
) -> tuple[JobState | None, TimelineEntry]:
    """Fold version 7's lease rule: any token above the current one (a forged jump applies)."""
    if isinstance(event, JobLeased) and state is not None and event.token > state.token + 1:
        new, entry = fold(replace(state, token=event.token - 1), event, position)
        return (new, entry) if entry.verdict is Verdict.APPLIED else (state, entry)
    return fold(state, event, position)


def test_a_fold_that_takes_a_forged_token_jump_is_caught() -> None:
    expected = load_expected(CORPUS / "forged_leases.expected.json")
    first = compare(expected, refold("forged_leases", fold_job=takes_any_higher_token)).first
    assert first is not None
    assert (first.kind, first.field, first.expected, first.actual) == (
        "JobLeased",
        "verdict",
        "rejected",
        "applied",
    )


def test_a_fold_without_the_recordings_keys_takes_the_forged_facts() -> None:
    """``forged_facts`` is judged with the keys kept beside it (``<name>.node-key``); folded
    without them, nothing is required and the forger's completion with the live token is
    applied: the recorded rejection has teeth."""
    history = CORPUS / "forged_facts.history.avro"
    expected = load_expected(CORPUS / "forged_facts.expected.json")
    assert keyring_for(history) is not None
    assert compare(expected, refold("forged_facts", keyring=keyring_for(history))).identical
    first = compare(expected, refold("forged_facts")).first
    assert first is not None
    assert (first.kind, first.field, first.expected, first.actual) == (
        "AttemptSucceeded",
        "verdict",
        "rejected",
        "applied",
    )
