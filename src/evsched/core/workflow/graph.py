"""A workflow's graph as read from job states: every job reachable from one through its parents
(``after``) and children, each with how its parents resolved, bounded by a node cap.

Pure: the states come from ``lookup`` (an index read, a replica read), so the API's endpoint and
the operator's ``evsched workflow`` read the same graph the same way.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from evsched.core.state import JobState, Resolution, Status
from evsched.core.workflow import waits as workflows

# The default cap on the jobs one read returns (a group of 1,000 with its callback fits), and the
# most a caller may ask for.
DEFAULT_NODE_LIMIT = 2_000
MAX_NODE_LIMIT = 20_000

Lookup = Callable[[str], JobState | None]


@dataclass(frozen=True, slots=True, kw_only=True)
class ParentLink:
    """One parent of a job and how it resolved for it; ``outcome`` None: not yet.

    ``partition``/``offset`` is the record of the parent's end that resolved it.
    """

    id: str
    outcome: str | None = None
    partition: int | None = None
    offset: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class GraphNode:
    """A job of the workflow; ``found`` False for an id no job has here (unknown or purged)."""

    id: str
    found: bool
    task: str | None = None
    queue: str | None = None
    status: str | None = None
    attempt: int = 0
    max_attempts: int = 0
    rule: str | None = None
    results_to_args: str | None = None
    parents: tuple[ParentLink, ...] = ()
    children: tuple[str, ...] = ()
    # The parent resolution after which this job's rule released it ("released") or could no
    # longer be met ("gave_up", the job was cancelled); None while it waits or has no parents.
    decided_by: ParentLink | None = None
    decision: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkflowGraph:
    """The jobs reachable from ``root``, parents before children; ``truncated`` when the cap
    ``node_limit`` left some out."""

    root: str
    nodes: tuple[GraphNode, ...]
    truncated: bool
    node_limit: int

    def counts(self) -> dict[str, int]:
        """Jobs per status (``missing`` for ids without a job)."""
        found: dict[str, int] = {}
        for node in self.nodes:
            status = node.status or "missing"
            found[status] = found.get(status, 0) + 1
        return dict(sorted(found.items()))


def as_json(graph: WorkflowGraph) -> dict[str, Any]:
    """The graph as JSON values: what the API answers and ``evsched workflow --json`` prints."""
    return {**asdict(graph), "counts": graph.counts()}


def read_graph(root: str, lookup: Lookup, *, limit: int = DEFAULT_NODE_LIMIT) -> WorkflowGraph:
    """The workflow of ``root`` (which must exist: the caller says so otherwise), breadth first
    through parents and children, at most ``limit`` jobs."""
    states: dict[str, JobState | None] = {}
    queue = deque([root])
    truncated = False
    while queue:
        job_id = queue.popleft()
        if job_id in states:
            continue
        if len(states) >= limit:
            truncated = True
            break
        state = states[job_id] = lookup(job_id)
        if state is not None:
            queue.extend(j for j in (*state.after, *state.children) if j not in states)
    order = _parents_first(list(states), states)
    return WorkflowGraph(
        root=root,
        nodes=tuple(node_of(job_id, states[job_id]) for job_id in order),
        truncated=truncated,
        node_limit=limit,
    )


def node_of(job_id: str, state: JobState | None) -> GraphNode:
    if state is None:
        return GraphNode(id=job_id, found=False)
    return GraphNode(
        id=job_id,
        found=True,
        task=state.task,
        queue=state.queue,
        status=str(state.status),
        attempt=state.attempt,
        max_attempts=state.max_attempts,
        rule=state.after_rule if state.after else None,
        results_to_args=state.results_to_args if state.after else None,
        parents=tuple(_links(state)),
        children=state.children,
        **_decided(state),
    )


def _links(state: JobState) -> Iterable[ParentLink]:
    resolved = {r.parent_id: r for r in state.resolutions}
    for parent in state.after:
        yield _link(resolved.get(parent)) or ParentLink(id=parent)


def _link(resolution: Resolution | None) -> ParentLink | None:
    if resolution is None:
        return None
    return ParentLink(
        id=resolution.parent_id,
        outcome=resolution.outcome,
        partition=resolution.partition,
        offset=resolution.offset,
    )


def _decided(state: JobState) -> dict[str, Any]:
    """The resolution after which the job's rule released it or gave up, and which it was."""
    if state.status is Status.WAITING:
        return {}
    for count in range(1, len(state.resolutions) + 1):
        done = state.resolutions[:count]
        outcome = workflows.rule_outcome(state.after_rule, state.after, done)
        if outcome != "wait":
            decision = "released" if outcome == "release" else "gave_up"
            return {"decided_by": _link(done[-1]), "decision": decision}
    return {}


def _parents_first(found: list[str], states: dict[str, JobState | None]) -> list[str]:
    """``found`` (breadth-first order) reordered so every parent comes before its children;
    ties keep the breadth-first order. Edges to jobs outside ``found`` are left out."""
    place = {job_id: i for i, job_id in enumerate(found)}
    waiting: dict[str, set[str]] = {}
    children: dict[str, list[str]] = {j: [] for j in found}
    for job_id in found:
        state = states[job_id]
        waiting[job_id] = set() if state is None else {p for p in state.after if p in place}
        for parent in waiting[job_id]:
            children[parent].append(job_id)
    ready = [place[j] for j in found if not waiting[j]]
    heapq.heapify(ready)
    order: list[str] = []
    while ready:
        job_id = found[heapq.heappop(ready)]
        order.append(job_id)
        for child in children[job_id]:
            waiting[child].discard(job_id)
            if not waiting[child]:
                heapq.heappush(ready, place[child])
    # A cycle cannot be enqueued (a parent must exist first), but a foreign producer's could be.
    placed = set(order)
    return order + [j for j in found if j not in placed]


def waiting_cycle(after: Mapping[str, Sequence[str]]) -> tuple[str, ...] | None:
    """Jobs of ``after`` (each job id's parents) that wait on one another in a cycle, in wait
    order with the first one again at the end (``a, b, a``: a waits on b, b on a); None when
    there is none. Parents outside ``after`` are not followed: they are not the caller's to judge.
    """
    marks: dict[str, bool] = {}  # True while on the walk's path, False once explored
    for root in after:
        if root in marks:
            continue
        path, parents = [root], [iter(after[root])]
        marks[root] = True
        while parents:
            parent = next(parents[-1], None)
            if parent is None:
                marks[path.pop()] = False
                parents.pop()
            elif marks.get(parent):
                return (*path[path.index(parent) :], parent)
            elif parent in after and parent not in marks:
                marks[parent] = True
                path.append(parent)
                parents.append(iter(after[parent]))
    return None
