"""How ``evsched workflow`` prints a workflow's graph for people: one row per job, parents first,
with what released it (the parent's end, partition@offset) or what it still waits on."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text

from evsched.core.state import Status
from evsched.core.workflow.graph import GraphNode, WorkflowGraph
from evsched.operator.render import status_text


def graph_title(graph: WorkflowGraph) -> str:
    counts = ", ".join(f"{n} {status}" for status, n in graph.counts().items())
    cut = f"; truncated at {graph.node_limit} jobs (--limit)" if graph.truncated else ""
    return f"workflow of {graph.root}: {len(graph.nodes)} jobs ({counts}){cut}"


def graph_table(graph: WorkflowGraph) -> Table:
    table = Table(title=graph_title(graph), title_justify="left")
    for name in ("job", "task", "status", "attempt", "rule", "parents"):
        table.add_column(name, overflow="fold")
    for node in graph.nodes:
        table.add_row(*_row(node, root=node.id == graph.root))
    return table


def _row(node: GraphNode, *, root: bool) -> tuple[str | Text, ...]:
    name = f"{node.id} *" if root else node.id
    if not node.found:
        return name, "", Text("missing", style="red"), "", "", "no job with this id here"
    status = status_text(Status(str(node.status)))
    attempt = f"{node.attempt}/{node.max_attempts}"
    return name, str(node.task), status, attempt, node.rule or "", parents_text(node)


def parents_text(node: GraphNode) -> str:
    """What moved the job, or what it waits on: ``released by p1@23 (a1 succeeded)``."""
    if not node.parents:
        return ""
    decided = node.decided_by
    if decided is not None:
        verb = "released by" if node.decision == "released" else "cancelled by"
        return f"{verb} p{decided.partition}@{decided.offset} ({decided.id} {decided.outcome})"
    waiting = [link.id for link in node.parents if link.outcome is None]
    resolved = len(node.parents) - len(waiting)
    done = f" ({resolved} of {len(node.parents)} resolved)" if resolved else ""
    lead = "waiting on" if node.status == Status.WAITING else "not resolved by"
    return f"{lead} {', '.join(waiting)}{done}" if waiting else f"waiting{done}"
