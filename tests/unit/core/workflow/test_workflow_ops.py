"""core.workflow.graph and core.workflow.ops: the graph read from job states, the cancel and
requeue plans over it, and the fold's rewait (a child requeued to wait again on its parents)."""

from __future__ import annotations

import itertools
from dataclasses import replace
from typing import Any

from evsched.core.events import (
    AttemptFailed,
    AttemptStarted,
    AttemptSucceeded,
    ChildRegistered,
    JobCancelled,
    JobEnqueued,
    JobEvent,
    JobLeased,
    JobRequeued,
    ParentResolved,
    Position,
)
from evsched.core.fold import fold
from evsched.core.invariants import replay
from evsched.core.state import JobState, Status, Verdict
from evsched.core.workflow import graph as wg
from evsched.core.workflow.invariants import RELEASED_ONCE_BY_AN_ACCEPTED_END
from evsched.core.workflow.ops import REQUEUE, REWAIT, cancel_plan, requeue_plan, rewait_refusal

T0 = 1_000_000
_seq = itertools.count()


def _meta(job_id: str) -> dict[str, Any]:
    return {"event_id": f"e{next(_seq)}", "job_id": job_id, "emitted_at": 0, "source": "test"}


def enqueue(job_id: str, *after: str, **over: Any) -> JobEnqueued:
    fields: dict[str, Any] = {"task": "t", "queue": "q", "args": b'{"args":[],"kwargs":{}}'}
    return JobEnqueued(**_meta(job_id), **{**fields, "after": after, **over})


def register(parent: str, child: str) -> ChildRegistered:
    return ChildRegistered(**_meta(parent), child_id=child)


def requeue(job_id: str, *, rewait: bool = False, run_at: int | None = None) -> JobRequeued:
    return JobRequeued(**_meta(job_id), rewait=rewait, run_at=run_at)


class Log:
    """One partition: events folded in order, states kept per job, positions remembered."""

    def __init__(self) -> None:
        self.states: dict[str, JobState | None] = {}
        self.history: list[tuple[JobEvent, Position]] = []
        self.entries: list[Any] = []

    def add(self, *events: JobEvent) -> Any:
        for event in events:
            pos = Position(partition=0, offset=len(self.history), log_at=T0 + len(self.history))
            state, entry = fold(self.states.get(event.job_id), event, pos)
            self.states[event.job_id] = state
            self.history.append((event, pos))
            self.entries.append(entry)
        return self.entries[-1]

    def ended(self, job_id: str, *, ok: bool) -> int:
        """Run the job once to success (or a permanent failure); the offset of its end."""
        token = self.states[job_id].token + 1  # type: ignore[union-attr]
        common = {"token": token}
        self.add(JobLeased(**_meta(job_id), attempt=1, lease_ms=60_000, **common))
        self.add(AttemptStarted(**_meta(job_id), worker_id="w", lease_ms=60_000, **common))
        if ok:
            self.add(AttemptSucceeded(**_meta(job_id), result=b'"r"', **common))
        else:
            self.add(
                AttemptFailed(
                    **_meta(job_id), error_type="E", message="no", retryable=False, **common
                )
            )
        return len(self.history) - 1

    def resolve(self, child: str, parent: str, at: int) -> Any:
        """The resolution the parent's node sends for its end at offset ``at``."""
        outcome = str(self.states[parent].status)  # type: ignore[union-attr]
        return self.add(
            ParentResolved(
                **_meta(child), parent_id=parent, outcome=outcome, parent_partition=0,
                parent_offset=at, result=b'"r"' if outcome == "succeeded" else None,
            )
        )  # fmt: skip

    def lookup(self, job_id: str) -> JobState | None:
        return self.states.get(job_id)

    def graph(self, root: str, limit: int = wg.DEFAULT_NODE_LIMIT) -> wg.WorkflowGraph:
        return wg.read_graph(root, self.lookup, limit=limit)


def chain_cut_by_a_dead_parent() -> Log:
    """a -> b -> c: a succeeds, b dies, c is cancelled by its rule."""
    log = Log()
    log.add(enqueue("a"), enqueue("b", "a"), register("a", "b"))
    log.add(enqueue("c", "b"), register("b", "c"))
    log.resolve("b", "a", log.ended("a", ok=True))
    log.resolve("c", "b", log.ended("b", ok=False))
    return log


# --- the graph ------------------------------------------------------------------------------


def test_the_graph_lists_every_job_parents_first_with_their_resolutions() -> None:
    log = chain_cut_by_a_dead_parent()
    graph = log.graph("c")
    assert [n.id for n in graph.nodes] == ["a", "b", "c"]
    a, b, c = graph.nodes
    assert (a.status, a.rule, a.parents, a.children) == ("succeeded", None, (), ("b",))
    assert b.rule == "all_succeeded" and b.decision == "released"
    assert b.decided_by == wg.ParentLink(id="a", outcome="succeeded", partition=0, offset=7)
    assert c.status == "cancelled" and c.decision == "gave_up"
    assert c.parents == (wg.ParentLink(id="b", outcome="dead", partition=0, offset=11),)
    assert not graph.truncated
    assert graph.counts() == {"cancelled": 1, "dead": 1, "succeeded": 1}
    document = wg.as_json(graph)
    assert document["counts"] == graph.counts() and document["nodes"][2]["decision"] == "gave_up"


def test_a_waiting_child_and_an_unknown_parent() -> None:
    log = Log()
    log.add(enqueue("a"), enqueue("c", "a", "ghost"), register("a", "c"))
    graph = log.graph("a")
    assert [n.id for n in graph.nodes] == ["a", "ghost", "c"]
    ghost = graph.nodes[1]
    assert not ghost.found and ghost.status is None
    c = graph.nodes[2]
    assert c.status == "waiting" and c.decided_by is None and c.decision is None
    assert [p.outcome for p in c.parents] == [None, None]
    assert graph.counts() == {"missing": 1, "scheduled": 1, "waiting": 1}


def test_a_group_is_cut_at_the_node_limit() -> None:
    log = Log()
    log.add(enqueue("cb", *[f"m{i}" for i in range(5)]))
    for i in range(5):
        log.add(enqueue(f"m{i}"), register(f"m{i}", "cb"))
    graph = log.graph("cb", limit=3)
    assert graph.truncated and graph.node_limit == 3
    assert [n.id for n in graph.nodes] == ["m0", "m1", "cb"]
    assert len(log.graph("m3").nodes) == 6


def test_a_foreign_cycle_still_reads() -> None:
    log = Log()
    log.states["x"] = fold(None, enqueue("x", "y"), Position(partition=0, offset=0, log_at=T0))[0]
    log.states["y"] = fold(None, enqueue("y", "x"), Position(partition=0, offset=1, log_at=T0))[0]
    assert [n.id for n in log.graph("x").nodes] == ["x", "y"]


def test_a_cancelled_child_that_never_heard_from_its_parent_has_no_decision() -> None:
    log = Log()
    log.add(enqueue("a"), enqueue("c", "a"), register("a", "c"), JobCancelled(**_meta("c")))
    node = log.graph("c").nodes[1]
    assert node.status == "cancelled" and node.decided_by is None


# --- the fold's rewait -----------------------------------------------------------------------


def test_a_child_cancelled_by_a_dead_parent_waits_again_and_is_released_once() -> None:
    log = chain_cut_by_a_dead_parent()
    entry = log.add(requeue("b"), requeue("c", rewait=True))
    assert entry.verdict is Verdict.APPLIED, entry.reason
    assert entry.reason == "requeued by test to wait again on 1 of its 1 parents"
    c = log.states["c"]
    assert c is not None and c.status is Status.WAITING and c.resolutions == ()
    assert c.attempt == 0 and c.run_at == T0 + 14
    entry = log.resolve("c", "b", log.ended("b", ok=True))
    assert entry.verdict is Verdict.APPLIED and "released" in entry.reason
    assert log.states["c"].status is Status.SCHEDULED  # type: ignore[union-attr]
    folded = replay(log.history)
    assert folded.violations == []
    # The same resolution once more in the same run is a breach; the fold calls it a duplicate.
    assert log.resolve("c", "b", len(log.history) - 2).verdict is Verdict.DUPLICATE


def _lenient(state: JobState | None, event: JobEvent, pos: Position) -> tuple[JobState | None, Any]:
    """A broken fold that forgets which parents resolved a child before each resolution."""
    if isinstance(event, ParentResolved) and state is not None:
        state = replace(state, resolutions=())
    return fold(state, event, pos)


def test_i8_counts_a_rewait_as_a_new_wait_and_still_catches_a_repeat_within_one() -> None:
    log = chain_cut_by_a_dead_parent()
    log.add(requeue("b"), requeue("c", rewait=True))
    log.resolve("c", "b", log.ended("b", ok=True))
    repeat = replace(log.history[-1][0], event_id="again")
    pos = Position(partition=0, offset=len(log.history), log_at=T0 + 999)
    folded = replay([*log.history, (repeat, pos)], fold_job=_lenient)
    [breach] = folded.violations
    assert breach.invariant == RELEASED_ONCE_BY_AN_ACCEPTED_END and breach.offset == pos.offset
    assert "resolved by this parent again" in breach.detail


def test_rewait_keeps_successes_and_drops_failures() -> None:
    log = Log()
    log.add(enqueue("a"), enqueue("b"), enqueue("c", "a", "b"))
    log.add(register("a", "c"), register("b", "c"))
    log.resolve("c", "a", log.ended("a", ok=True))
    log.resolve("c", "b", log.ended("b", ok=False))
    node = log.graph("c").nodes[-1]
    assert node.decided_by is not None and node.decided_by.id == "b"  # a's left it waiting
    log.add(requeue("c", rewait=True, run_at=T0 + 50_000))
    c = log.states["c"]
    assert c is not None and [r.parent_id for r in c.resolutions] == ["a"]
    assert c.run_at == T0 + 50_000


def test_rewait_is_refused_with_its_reason() -> None:
    log = chain_cut_by_a_dead_parent()
    assert log.add(requeue("a", rewait=True)).reason == ("cannot requeue to wait: job is succeeded")
    log.add(requeue("b"))
    assert log.add(requeue("b", rewait=True)).reason == "cannot requeue to wait: job is scheduled"
    log.ended("b", ok=False)
    entry = log.add(requeue("b", rewait=True))
    assert entry.verdict is Verdict.REJECTED
    assert entry.reason == (
        "cannot requeue to wait: its parents released it (rule all_succeeded met)"
    )
    log.add(enqueue("root"), JobCancelled(**_meta("root")))
    entry = log.add(requeue("root", rewait=True))
    assert entry.reason == "cannot requeue to wait: it waits on no parent"
    assert log.add(requeue("nobody", rewait=True)).reason == "unknown job"


def test_rewait_refused_when_a_parent_is_unknown() -> None:
    log = Log()
    log.add(enqueue("c", "ghost"))
    log.add(
        ParentResolved(
            **_meta("c"), parent_id="ghost", outcome="unknown", parent_partition=0, parent_offset=0
        )
    )
    assert log.states["c"].status is Status.CANCELLED  # type: ignore[union-attr]
    entry = log.add(requeue("c", rewait=True))
    assert entry.verdict is Verdict.REJECTED
    assert (
        entry.reason
        == "cannot requeue to wait: rule all_succeeded can no longer be met (ghost unknown)"
    )


def test_rewait_refusal_outcomes() -> None:
    assert rewait_refusal("all_succeeded", (), ()) == (REQUEUE, "it waits on no parent")


# --- the plans ------------------------------------------------------------------------------


def test_cancel_plan_is_children_first_and_knows_the_finished() -> None:
    log = Log()
    log.add(enqueue("a"), enqueue("b", "a"), register("a", "b"))
    log.add(enqueue("c", "b", "ghost"), register("b", "c"))
    log.resolve("b", "a", log.ended("a", ok=True))
    plan = cancel_plan(log.graph("a"))
    assert plan.cancel == ("c", "b")
    assert plan.finished == ("a",)
    assert plan.missing == ("ghost",)
    assert requeue_plan(log.graph("a")).settling == ()


def test_requeue_plan_reruns_the_dead_parent_and_rewaits_its_children() -> None:
    log = chain_cut_by_a_dead_parent()
    plan = requeue_plan(log.graph("a"))
    assert plan.steps == (("b", REQUEUE), ("c", REWAIT))
    assert plan.rewaits == 1 and plan.skipped == () and plan.settling == ()


def test_requeue_plan_waits_for_ends_in_flight() -> None:
    log = Log()
    log.add(enqueue("a"), enqueue("b", "a"), register("a", "b"))
    log.ended("a", ok=False)  # its resolution has not reached b yet
    plan = requeue_plan(log.graph("b"))
    assert plan.settling == ("b has not yet recorded the end of its parent a",)


def test_requeue_plan_skips_a_child_whose_failed_parent_will_not_end_again() -> None:
    log = chain_cut_by_a_dead_parent()
    log.add(requeue("b"))
    log.ended("b", ok=True)  # re-run by hand: its success reached c as a duplicate
    log.resolve("c", "b", len(log.history) - 1)
    plan = requeue_plan(log.graph("a"))
    assert plan.steps == ()
    assert plan.skipped == (("c", "parent b is succeeded and will not end again"),)


def test_requeue_plan_skips_what_cannot_wait_again() -> None:
    log = Log()
    log.add(enqueue("c", "ghost"))
    log.add(
        ParentResolved(
            **_meta("c"), parent_id="ghost", outcome="unknown", parent_partition=0, parent_offset=0
        )
    )
    plan = requeue_plan(log.graph("c"))
    assert plan.steps == ()
    assert plan.skipped == (("c", "rule all_succeeded can no longer be met (ghost unknown)"),)


def test_requeue_plan_of_a_child_whose_parent_is_gone() -> None:
    log = chain_cut_by_a_dead_parent()
    del log.states["b"]  # purged
    plan = requeue_plan(log.graph("c"))
    assert plan.skipped == (("c", "parent b is not in the index"),)


def test_requeue_plan_rewaits_children_cancelled_while_they_waited() -> None:
    log = Log()
    log.add(enqueue("a"), enqueue("b", "a"), register("a", "b"))
    log.add(JobCancelled(**_meta("b")), JobCancelled(**_meta("a")))
    log.resolve("b", "a", len(log.history) - 1)
    assert requeue_plan(log.graph("a")).steps == (("a", REQUEUE), ("b", REWAIT))


def test_a_diamond_reads_each_job_once_parents_first() -> None:
    log = Log()
    log.add(enqueue("a"), enqueue("b", "a"), enqueue("c", "a"), enqueue("d", "c", "b"))
    log.add(register("a", "b"), register("a", "c"), register("b", "d"), register("c", "d"))
    assert [n.id for n in log.graph("a").nodes] == ["a", "b", "c", "d"]
    assert [n.id for n in log.graph("d").nodes] == ["a", "c", "b", "d"]


def test_requeue_plan_rewaits_a_child_whose_parent_was_requeued_by_hand() -> None:
    log = chain_cut_by_a_dead_parent()
    log.add(requeue("b"), enqueue("x", "b"), register("b", "x"))
    plan = requeue_plan(log.graph("a"))
    assert plan.steps == (("c", REWAIT),)
    assert plan.settling == () and plan.skipped == ()
