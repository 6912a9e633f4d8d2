"""Every history in ``replay/`` replays its nodes' decisions identically with the current planner
and the settings its ``<name>.decisions.json`` declares, and a changed lease order is caught."""

from __future__ import annotations

from pathlib import Path

import pytest

from evsched.adapters.archive.history_file import read_history
from evsched.adapters.proofs import generate_key
from evsched.core import planner
from evsched.operator.commands.replay import keyring_for, recording_keyring
from evsched.operator.commands.replay_decisions import Overrides, judge_history
from evsched.operator.decision_corpus import decisions_path, read_declared
from evsched.operator.decisions import LEASE, ORDER, diff_history

CORPUS = Path(__file__).resolve().parents[2] / "replay"
HISTORIES = sorted(CORPUS.glob("*.history.avro"))


@pytest.mark.parametrize("history", HISTORIES, ids=lambda path: path.name)
def test_each_history_replays_its_decisions_identically(history: Path) -> None:
    assert decisions_path(history).is_file()
    judged = judge_history(history, Overrides(), recording_keyring(history))
    assert judged.identical, [d.describe() for d in judged.divergences]
    assert judged.declared is not None and judged.diff.judged[LEASE] > 0


def test_the_corpus_judges_every_decision_kind() -> None:
    totals: dict[str, int] = {}
    for history in HISTORIES:
        judged = read_declared(decisions_path(history)).judged or {}
        for kind, count in judged.items():
            totals[kind] = totals.get(kind, 0) + count
    assert all(count > 0 for count in totals.values()), totals
    assert set(totals) == {"lease", "lease order", "expiry", "purge", "fire"}


def test_a_planner_leasing_the_latest_first_is_caught_by_job_and_offset(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    history = CORPUS / "lifecycle.history.avro"
    model = read_declared(decisions_path(history)).model
    events = list(read_history(history).events)
    assert diff_history(events, model).identical

    monkeypatch.setattr(planner, "due_order", lambda s: (-s.priority, -s.run_at, s.job_id))
    diff = diff_history(events, model)
    first = diff.first[ORDER]
    # Found by running it: the first step of partition 0 with two leases of different run_at.
    assert (first.entity, first.partition, first.offset) == (
        "1624038f-c05d-4d23-899a-9f1a7ae6392e",
        0,
        516,
    )
    assert first.planned == "lease 736c09fd-5932-4087-826e-08f7db9ebb3f first"
    assert set(diff.first) == {ORDER} and diff.diverged[ORDER] > 1


def test_a_recordings_own_node_keys_win_over_the_shells(monkeypatch: pytest.MonkeyPatch) -> None:
    history = CORPUS / "forged_facts.history.avro"
    monkeypatch.setenv("EVSCHED_NODE_KEY", generate_key())  # an operator's keys, not the run's
    judged = judge_history(history, Overrides(), recording_keyring(history))
    assert judged.identical, [d.describe() for d in judged.divergences]
    foreign = judge_history(history, Overrides(), keyring_for(history))
    assert not foreign.identical  # judged with other keys, a proven lease counts as refused
