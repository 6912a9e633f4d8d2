"""Planner replay: a history whose decisions the current planner made replays clean, and a planner
that would decide otherwise (another order, another lease, no expiry) is named by job and offset."""

from __future__ import annotations

import asyncio
import itertools
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from evsched.adapters import avro
from evsched.adapters.archive.history_file import LoggedEvent, write_history
from evsched.core import events as ev
from evsched.core import planner
from evsched.core.invariants import Replay
from evsched.core.state import Status
from evsched.operator.archiver import Roll
from evsched.operator.decision_corpus import decisions_path, dump_declared, read_declared
from evsched.operator.decisions import (
    EXPIRY,
    LEASE,
    ORDER,
    PURGE,
    DecisionModel,
    diff_history,
)
from evsched.testing import MemoryPartitionLog
from tests.unit.operator.test_archiver import archive_once

T0 = 1_767_225_600_000
BUDGETS = planner.PlannerBudgets(dispatch_timeout_ms=5_000, prelease_ms=0)
MODEL = DecisionModel(budgets=BUDGETS)
_ids = itertools.count()


class Node:
    """One partition's log written by clients, a worker and an honest node using the planner."""

    def __init__(self) -> None:
        self.at = T0
        self.logged: list[LoggedEvent] = []
        self.replay = Replay()

    def add(self, event: ev.Event, after_ms: int = 10) -> int:
        self.at += after_ms
        offset = len(self.logged)
        position = ev.Position(partition=0, offset=offset, log_at=self.at)
        self.replay.feed(event, position)
        value = avro.encode_event(event)
        key = ev.entity_id(event).encode()
        self.logged.append(
            LoggedEvent(
                partition=0,
                offset=offset,
                log_at=self.at,
                key=key,
                value=value,
                kind=type(event).__name__,
            )
        )
        return offset

    def enqueue(self, job: str, *, priority: int = 0, after_ms: int = 10) -> int:
        meta = {"event_id": f"e{next(_ids)}", "job_id": job, "emitted_at": 0, "source": "client"}
        enqueued = ev.JobEnqueued(
            **meta, task="t", queue="default", args=b"[]", priority=priority, max_attempts=2
        )
        return self.add(enqueued, after_ms)

    def step(self, *, after_ms: int = 2_000) -> list[int]:
        """The planner's leases and expiries at the node's clock, appended 3 ms later."""
        now = self.at + after_ms
        self.at = now + 3 - 10
        states = list(self.replay.jobs.values())
        leases = planner.plan_leases(states, {}, now=now, budgets=BUDGETS, source="node-1")
        expiries = planner.plan_expiries(states, now=now, source="node-1")
        decided: list[ev.Event] = [*(lease.event for lease in leases), *expiries]
        return [self.add(event) for event in decided]


def honest() -> Node:
    """Four jobs of three priorities leased in one step; one lease expires unstarted."""
    node = Node()
    node.enqueue("low", priority=0)
    node.enqueue("high", priority=9)
    node.enqueue("mid-a", priority=5)
    node.enqueue("mid-b", priority=5)
    assert len(node.step()) == 4  # high, mid-a, mid-b, low
    assert len(node.step(after_ms=6_000)) == 4  # every lease expired: no worker came
    return node


def test_an_honest_history_replays_identical_and_every_decision_is_judged() -> None:
    diff = diff_history(honest().logged, MODEL)
    assert diff.identical, [d.describe() for d in diff.firsts()]
    assert (diff.judged[LEASE], diff.judged[ORDER], diff.judged[EXPIRY]) == (4, 1, 4)
    assert diff.refused == 0 and diff.events == 12


def test_inverted_priorities_are_caught_naming_the_job_and_offset(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    history = honest().logged
    monkeypatch.setattr(planner, "due_order", lambda s: (s.priority, s.run_at, s.job_id))

    diff = diff_history(history, MODEL)
    first = diff.first[ORDER]
    # The recording leased "high" (offset 4) before "mid-a": the changed planner would not.
    assert (first.entity, first.offset) == ("high", 4)
    assert first.planned == "lease mid-a first"
    assert "priority 5" in first.why and "priority 9" in first.why
    assert set(diff.first) == {ORDER}  # each lease on its own is still what the planner makes


def test_a_job_passed_over_for_a_later_one_of_its_queue_is_caught() -> None:
    node = Node()
    node.enqueue("first", priority=1)
    node.enqueue("second", priority=0)
    now = node.at + 2_000
    states = [node.replay.jobs["second"]]  # a node that forgot "first"
    (lease,) = planner.plan_leases(states, {}, now=now, budgets=BUDGETS, source="node-1")
    node.at = now - 7
    offset = node.add(lease.event)

    first = diff_history(node.logged, MODEL).first[ORDER]
    assert (first.entity, first.offset) == ("second", offset)
    assert first.recorded == "lease second (passed over first)"


def test_a_job_the_node_may_not_have_folded_yet_is_not_counted_as_passed_over() -> None:
    node = Node()
    node.enqueue("second", priority=0)
    node.enqueue("late", priority=9, after_ms=2_000)  # 500 ms before the step: within lag_ms
    now = node.at + 500
    (lease,) = planner.plan_leases(
        [node.replay.jobs["second"]], {}, now=now, budgets=BUDGETS, source="node-1"
    )
    node.at = now - 7
    node.add(lease.event)
    assert diff_history(node.logged, MODEL).identical
    assert not diff_history(node.logged, replace(MODEL, lag_ms=0)).identical


def test_another_lease_from_the_planner_names_the_field() -> None:
    diff = diff_history(
        honest().logged,
        replace(MODEL, budgets=replace(BUDGETS, prelease_ms=0, dispatch_timeout_ms=9)),
    )
    first = diff.first[LEASE]
    assert (first.entity, first.offset) == ("high", 4)
    assert first.why == "fields differ: lease_ms"
    assert diff.diverged[LEASE] == 4


def test_a_decision_the_planner_would_not_make_says_why() -> None:
    node = Node()
    node.enqueue("job")
    node.step()
    now = node.at + 1_000  # 1 s into a 5 s lease: the planner expires nothing yet
    expired = ev.LeaseExpired(
        event_id=f"e{next(_ids)}", job_id="job", emitted_at=now, source="node-1", token=1
    )
    node.at = now + 4_500  # appended after the lease ran out, so the fold applies it
    offset = node.add(expired)

    diff = diff_history(node.logged, MODEL)
    first = diff.first[EXPIRY]
    assert (first.entity, first.offset, first.planned) == ("job", offset, "nothing")
    assert first.why.startswith("lease_until ") and f"is after now {now}" in first.why


def test_decisions_the_fold_refused_and_foreign_writers_are_not_judged() -> None:
    node = honest()
    forged = ev.JobLeased(
        event_id="forged",
        job_id="low",
        emitted_at=0,
        source="node-forger",
        token=99,
        attempt=1,
        lease_ms=1,
    )
    node.add(forged)
    purge = ev.JobPurged(event_id="p", job_id="low", emitted_at=0, source="client", generation=0)
    node.add(purge)
    diff = diff_history(node.logged, MODEL)
    assert diff.identical and diff.refused == 1 and diff.judged[PURGE] == 0


def test_purges_are_replanned_from_the_finished_state() -> None:
    node = Node()
    node.enqueue("job")
    node.step()
    node.add(ev.JobCancelled(event_id="c", job_id="job", emitted_at=0, source="client"))
    state = node.replay.jobs["job"]
    assert state.status is Status.CANCELLED
    now = node.at + 8 * 86_400_000
    (purge,) = planner.plan_purges([state], now=now, source="node-1")
    node.at = now
    node.add(purge)
    diff = diff_history(node.logged, MODEL)
    assert diff.identical and diff.judged[PURGE] == 1


runner = CliRunner()


def _write(tmp_path: Path, logged: list[LoggedEvent]) -> Path:
    history = tmp_path / "n.history.avro"
    with history.open("wb") as out:
        write_history(out, logged, metadata={"corpus": "n"})
    return history


def test_the_command_exits_0_when_equal_and_1_naming_the_first_divergence(
    cli: typer.Typer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    history = _write(tmp_path, honest().logged)
    declared = decisions_path(history)
    declared.write_text(dump_declared(history.name, MODEL, diff_history(honest().logged, MODEL)))
    result = runner.invoke(cli, ["replay", "--decisions", str(history)])
    assert result.exit_code == 0 and "identical" in result.output

    monkeypatch.setattr(planner, "due_order", lambda s: (s.priority, s.run_at, s.job_id))
    result = runner.invoke(cli, ["replay", "--decisions", str(history)], env={"COLUMNS": "300"})
    assert result.exit_code == 1
    assert "first lease order: high at p0@4: recorded lease high (leased before mid-a)" in (
        result.output
    )
    result = runner.invoke(cli, ["replay", "--decisions", str(tmp_path), "--json"])
    (report,) = json.loads(result.output)
    assert report["identical"] is False and report["divergences"][0]["offset"] == 4


def test_the_declared_model_is_used_and_kept_on_update(cli: typer.Typer, tmp_path: Path) -> None:
    history = _write(tmp_path, honest().logged)
    # Without a decisions file the node defaults apply: 30 s leases, not the recorded 5 s.
    result = runner.invoke(cli, ["replay", "--decisions", str(history)])
    assert result.exit_code == 1 and "default planner settings" in result.output
    args = ["replay", "--decisions", str(history), "--dispatch-timeout-ms", "5000"]
    assert runner.invoke(cli, [*args, "--prelease-ms", "0", "--update-expected"]).exit_code == 0
    declared = read_declared(decisions_path(history))
    assert declared.model == MODEL and declared.judged == {
        "lease": 4,
        "lease order": 1,
        "expiry": 4,
        "purge": 0,
        "fire": 0,
    }
    assert runner.invoke(cli, ["replay", "--decisions", str(history)]).exit_code == 0

    document: dict[str, Any] = json.loads(decisions_path(history).read_text())
    document["judged"]["expiry"] = 5  # a walk that stopped judging one of them
    decisions_path(history).write_text(json.dumps(document))
    result = runner.invoke(cli, ["replay", "--decisions", str(history)], env={"COLUMNS": "300"})
    assert result.exit_code == 1 and "recorded expiry 5, planner: expiry 4" in result.output


@pytest.mark.parametrize(
    ("document", "words"),
    [
        ("{", "is not JSON"),
        ('{"format": "other"}', "is not an evsched decisions file"),
        (
            '{"format": "evsched.decisions/1", "planner": {"prelease_ms": -1}}',
            "planner.prelease_ms",
        ),
        ('{"format": "evsched.decisions/1", "planner": []}', "'planner' must be an object"),
    ],
)
def test_a_bad_decisions_file_is_refused_naming_the_field(
    cli: typer.Typer, tmp_path: Path, document: str, words: str
) -> None:
    history = _write(tmp_path, honest().logged)
    decisions_path(history).write_text(document)
    result = runner.invoke(cli, ["replay", "--decisions", str(history)], env={"COLUMNS": "300"})
    assert result.exit_code == 4 and words in result.output


def test_planner_settings_without_decisions_are_a_usage_error(
    cli: typer.Typer, tmp_path: Path
) -> None:
    history = _write(tmp_path, honest().logged)
    result = runner.invoke(cli, ["replay", str(history), "--prelease-ms", "0"])
    assert result.exit_code == 2 and "--decisions" in result.output
    result = runner.invoke(cli, ["replay", "--decisions"])
    assert result.exit_code == 2
    result = runner.invoke(cli, ["replay", "--partition", "0"], env={"COLUMNS": "300"})
    assert result.exit_code == 2 and "the live log is replayed with --decisions" in result.output
    args = ["replay", "--decisions", "--partition", "0", "--from", "9", "--to", "3"]
    result = runner.invoke(cli, args, env={"COLUMNS": "300"})
    assert result.exit_code == 2 and "--to 3 is before --from 9" in result.output
    result = runner.invoke(cli, ["replay", "--decisions", "--to", "3"], env={"COLUMNS": "300"})
    assert result.exit_code == 2 and "add --partition" in result.output
    missing = tmp_path / "none.decisions.json"
    result = runner.invoke(
        cli, ["replay", "--decisions", "--archive", str(tmp_path), "--expected", str(missing)]
    )
    assert result.exit_code == 3


def test_an_archive_replays_with_the_decisions_file_it_was_given(
    cli: typer.Typer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = MemoryPartitionLog(partitions=1)
    for logged in honest().logged:
        log.append(0, logged.value, key=logged.key, log_at=logged.log_at)
    root = tmp_path / "archive"
    asyncio.run(archive_once(log, root, Roll(records=3)))
    declared = tmp_path / "prod.decisions.json"
    args = ["replay", "--decisions", "--archive", str(root), "--expected", str(declared)]
    assert runner.invoke(cli, args).exit_code == 3  # no such file yet
    settings = ["--dispatch-timeout-ms", "5000", "--prelease-ms", "0"]
    assert runner.invoke(cli, [*args, *settings, "--update-expected"]).exit_code == 0
    assert read_declared(declared).model == MODEL
    result = runner.invoke(cli, [*args, "--json"])
    (report,) = json.loads(result.output)
    assert result.exit_code == 0 and report["judged"]["lease"] == 4

    monkeypatch.setattr(planner, "due_order", lambda s: (s.priority, s.run_at, s.job_id))
    assert runner.invoke(cli, args).exit_code == 1
