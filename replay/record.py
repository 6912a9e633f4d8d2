"""Re-records the replay corpus from real runs of the engine (node and worker processes, a broker).

Each scenario runs in a namespace of its own on the broker at ``EVSCHED_KAFKA_BOOTSTRAP`` (or a
local one from ``evsched kafka up``), with the harness of the engine tests
(``tests/integration/engine.py``) and the tasks of ``tests/integration/scenario_app.py``. After
the run it checks the invariants on what is in the log, exports the whole log to
``replay/<name>.history.avro`` and writes ``replay/<name>.expected.json`` with the verdicts and
states the engine's own replica index recorded, after checking that the current fold gives the
very same ones. Run from the repository root:

    EVSCHED_KAFKA_BOOTSTRAP=127.0.0.1:19092 .venv/bin/python replay/record.py [name ...]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import sys
import tempfile
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.integration.engine import Stack  # noqa: E402

from evsched.adapters import avro  # noqa: E402
from evsched.adapters.archive.history_file import HistoryWriter, read_history  # noqa: E402
from evsched.adapters.index.store import PartitionIndex, keyable  # noqa: E402
from evsched.adapters.kafka.topics import ensure_topics  # noqa: E402
from evsched.adapters.proofs import KEY_ENV  # noqa: E402
from evsched.core.events import CONTROL_EVENT_TYPES, LIMIT_EVENT_TYPES, entity_id  # noqa: E402
from evsched.operator.commands.replay import KEY_SUFFIX, keyring_for  # noqa: E402
from evsched.operator.export import LogRange, export_range  # noqa: E402
from evsched.operator.live_index import ReadOnlyIndex  # noqa: E402
from evsched.operator.replay import dump_expected, expected_document, fold_history  # noqa: E402
from evsched.operator.replica_dir import LocalIndex, catch_up  # noqa: E402
from replay import (  # noqa: E402
    poison_check,
    scenario_controls,
    scenario_cycles,
    scenario_leases,
    scenario_limits,
    scenario_orphans,
    scenario_poison,
    scenario_policies,
    scenario_proofs,
    scenario_snooze,
    scenario_workflow_ops,
    scenario_workflow_results,
    scenario_workflows,
    scenarios,
    scenarios_failures,
)

CORPUS = REPO / "replay"


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    run: Callable[[Stack], Awaitable[None]]
    all_terminal: bool = True


SCENARIOS = {
    s.name: s
    for s in (
        Scenario(
            "lifecycle",
            "One node, two workers: successes with effects, retries with backoff, permanent and "
            "exhausted dead letters, requeues (of dead and cancelled jobs), cancels while "
            "scheduled and while running, idempotency duplicates and conflicts, producer retries "
            "of the same bytes, undecodable records.",
            scenarios.lifecycle,
            all_terminal=False,  # some delayed jobs are left scheduled on purpose
        ),
        Scenario(
            "workers",
            "Workers that die or freeze: a SIGKILLed worker's job expires and reruns from its "
            "last checkpoint; a SIGSTOPped worker's completions come in stale, while the rerun "
            "runs and after it committed.",
            scenarios.workers,
        ),
        Scenario(
            "hardening",
            "Issue 9's fold rules: a job whose leases expire unstarted keeps its attempts and "
            "succeeds once a worker comes; a hostile producer's events beyond the limits (a 70 kB "
            "job id, queues that cannot be topic names, max_attempts 0, an overflowing run_at, "
            "lease token and lease_ms, a random cron, a template with a bad queue), a forged "
            "enqueue with a victim's body digest (conflict), and a record cut inside a double.",
            scenarios.hardening,
            all_terminal=False,  # the victim is delayed by an hour on purpose
        ),
        Scenario(
            "failures",
            "Fold version 3 (issue 13, items 4, 5, 10): failures with a category and a traceback "
            "(an app's own category, permanent, timeout), a cancel that reaches a running "
            "handler (its report comes in rejected), a succeeded job requeued without rerun "
            "(rejected) and with it (applied; it runs again), and a hostile producer's failure "
            "reports beyond the limits (an oversized traceback, a bad category).",
            scenarios_failures.failures,
        ),
        Scenario(
            "controls",
            "Pause and resume (fold version 3): a paused queue leases nothing while its running "
            "job finishes, a zombie's lease of a paused queue's job is rejected, a second pause "
            "and a resume of a running queue are rejected (on each of the 3 partitions); a "
            "paused schedule fires nothing, a zombie's fire is rejected, and on resume only the "
            "latest missed slot fires; a pause of an unknown schedule is rejected.",
            scenario_controls.controls,
        ),
        Scenario(
            "limits",
            "Global limits (fold version 4, issue 13 items 1 and 2) with two nodes: queue default "
            "limited to 2 running and 4 permits per second, keys cust-1 and cust-2 to 1 running; "
            "jobs ask the limits' homes for permits, are granted them in turn and give them back; "
            "a zombie's lease of a job waiting for its key's permit is rejected; forged permit "
            "steps (a grant to a finished job, an unknown action, a grant to an unknown job, "
            "whose release then comes back rejected) and a max_running of 0 are rejected.",
            scenario_limits.limits,
        ),
        Scenario(
            "cron",
            "Two nodes fire a cron schedule every 2 s (one node is killed midway): duplicate "
            "and refused fires, the fired jobs, then the schedule's deletion.",
            scenarios.cron_two_nodes,
        ),
        Scenario(
            "prelease",
            "Pre-leased delayed jobs (fold version 3): a node leases delayed jobs up to 20 s "
            "before their run_at and the worker starts each at run_at; a pre-lease that expires "
            "unstarted (no worker yet) costs no attempt; a job cancelled while pre-leased; a "
            "hostile producer's pre-leases of a job due in an hour, too far ahead and for "
            "another run_at, both rejected.",
            scenarios.prelease,
            all_terminal=False,  # the job due in an hour stays scheduled
        ),
        Scenario(
            "retention",
            "Issue 11's retention: jobs purged by the node when their short retention ends "
            "(succeeded and cancelled), purge marks expiring at later purges, a key reused "
            "inside its window (duplicate) and after it (run 1 of the same id), an id enqueued "
            "again after its purge (a new job), and forged purges: of a scheduled job, an "
            "unknown job, a purge before its time and one of an earlier run, each rejected.",
            scenarios.retention,
            all_terminal=False,  # a delayed job is left scheduled on purpose
        ),
        Scenario(
            "policies",
            "Fold version 4 (issue 13, items 7 and 8): a unique job (while queued) enqueued again "
            "while queued (duplicate), while running (held; the held run starts when the run "
            "ends) and once more (duplicate of the held one); a unique job (while queued or "
            "running) run again after it ended; a schedule every 2 s with a 5 s catch-up window "
            "and 1.5 s of jitter whose only node is stopped for 12 s, then another node fires "
            "one missed fire for the slots before the window and catches up the rest; a "
            "schedule every 2 s with overlap skip whose job runs until told (the fires meanwhile "
            "are duplicates of its one job id, then a new run); a backfill by the CLI, repeated "
            "(its jobs duplicates), and a hostile backfill of a future slot (rejected).",
            scenario_policies.policies,
        ),
        Scenario(
            "workflows",
            "Workflows (fold version 4): a chain of three whose middle step is retried once, a "
            "group of twelve over the three partitions with a callback (its members' results in "
            "order), a chain cut by a dead parent (the rest cancelled in turn), a zombie "
            "parent's stale success that releases nothing, a registration after the parent "
            "ended (answered at once) and one for an unknown parent (cancelled), and a hostile "
            "producer's workflow events: a self-dependency, a resolution of an unknown child, "
            "one from a parent the child does not wait on, and a repeated resolution (duplicate).",
            scenario_workflows.workflows,
            all_terminal=False,  # the forged self-waiter is never a job
        ),
        Scenario(
            "workflow_ops",
            "A whole workflow cancelled and requeued by the operator (fold version 5): a chain "
            "of four whose second step dies, the rest cancelled in turn, re-run once fixed by "
            "evsched workflow requeue (the dead step requeued, the cancelled ones waiting again "
            "and released once more); a group of four with a callback cancelled as a whole "
            "while its members run, cancelled again (nothing), then requeued and completed; a "
            "hostile producer's rewaits (of a succeeded job, of a job without parents, of an "
            "unknown job), each rejected.",
            scenario_workflow_ops.workflow_ops,
        ),
        Scenario(
            "workflow_results",
            "A job keeps at most MAX_RESULTS_BYTES of its parents' results (fold version 5): "
            "five parents returning 250,002 bytes each; a group callback that was to get them "
            "is cancelled with the reason at the fifth resolution, and a plain after= child of "
            "the same parents (no results passed) is released and runs, the fifth result kept "
            "out of its state.",
            scenario_workflow_results.workflow_results,
        ),
        Scenario(
            "orphans",
            "Rejected events of jobs the index does not hold expire (fold version 6): a zombie "
            "worker's late start and success of a purged job (rejected, unknown job) leave the "
            "index with the purge's mark at the next purge after its time; a forger's cancel, "
            "start and purge of an id never enqueued (rejected) stay for 7 days of log time.",
            scenario_orphans.orphans,
        ),
        Scenario(
            "poison",
            "The index keeps the newest 1,000 undecodable records and refused events of a "
            "partition (fold version 7): a foreign producer floods one partition with garbage "
            "and with enqueues of an empty job id (refused), past the bound, while jobs run and "
            "the partition changes owner; every index keeps only the newest 1,000 of each kind "
            "at or below its offset, while verdicts and tallies count them all.",
            scenario_poison.poison,
        ),
        Scenario(
            "forged_leases",
            "A lease applies only at the job's token + 1 (fold version 8, issue 32): a job due "
            "while no node runs, a forger's leases of it at 2^53 - 1 and at its token + 2, each "
            "rejected naming token 1; then the node leases it at token 1 and a worker runs it.",
            scenario_leases.forged_leases,
        ),
        Scenario(
            "forged_facts",
            "Proofs of role (fold version 9, issue 32): a node's and a worker's facts need their "
            "role's proof once a partition has seen one; a forger's completion with the live "
            "token and an effect, an expiry, a lease at 2^53 - 1 and one of ten years, a "
            "parent's resolution (a release and a dead), a permit grant and a permit release, "
            "each without a valid proof, are rejected as unproven; the worker's proven attempt "
            "succeeds and releases the child.",
            scenario_proofs.forged_facts,
            all_terminal=False,  # the parked job is due in an hour
        ),
        Scenario(
            "snooze",
            "Snoozes (fold version 10, issue 35): a handler snoozes twice for 1 s and succeeds at "
            "attempt 1; a task allowing one snooze whose handler always snoozes fails on its "
            "second snooze (snooze_limit) and dies after a retry; a forger's snoozes of an ended "
            "job, with a stale token, a negative or 30-day-plus delay, a negative cap, and of an "
            "unknown job, each refused.",
            scenario_snooze.snooze,
        ),
        Scenario(
            "batch_cycles",
            "A cycle of two waits written by a foreign producer (fold version 9, issue 32): "
            "cycle-a after cycle-b and cycle-b after cycle-a, both enqueued before either "
            "registration; each parent rejects the registration of a child it waits on itself "
            "and answers it refused, so both are cancelled instead of waiting for ever; a plain "
            "chain written the same way runs.",
            scenario_cycles.batch_cycles,
        ),
    )
}


async def record(scenario: Scenario, bootstrap: str, home: Path) -> None:
    namespace = f"corpus{scenario.name}{os.urandom(3).hex()}"
    await ensure_topics(bootstrap, namespace, event_partitions=3, queues=["default"])
    stack = Stack(bootstrap, namespace, home)
    # The recording's throwaway node keys: its nodes prove their facts with them, the replica and
    # the checks below judge the proofs with them, and the corpus keeps them beside the history
    # (evsched replay reads <name>.node-key) so a replay judges them the same way.
    os.environ[KEY_ENV] = stack.node_key
    (CORPUS / f"{scenario.name}{KEY_SUFFIX}").write_text(stack.node_key + "\n", encoding="utf-8")
    try:
        await scenario.run(stack)
        await stack.check(all_terminal=scenario.all_terminal)
    finally:
        await stack.close()
    history = CORPUS / f"{scenario.name}.history.avro"
    await export(stack, scenario, history)
    local = await catch_up(stack.settings, home / "replica")
    try:
        document = verified_outcome(history, local, scenario)
    finally:
        local.close()
    checked = check_nodes(history, home)
    expected = CORPUS / f"{scenario.name}.expected.json"
    expected.write_text(dump_expected(document), encoding="utf-8")
    size = history.stat().st_size + expected.stat().st_size
    print(
        f"{scenario.name}: {document['events']} events, {len(document['jobs'])} jobs, "
        f"{size} bytes; {checked} node index entries agree"
    )


async def export(stack: Stack, scenario: Scenario, history: Path) -> None:
    partial = history.with_suffix(".partial")
    metadata = {"corpus": scenario.name, "description": scenario.description}
    with partial.open("wb") as stream:
        writer = HistoryWriter(stream, metadata=metadata)
        await export_range(stack.settings, LogRange(), writer, None)
        writer.close()
    partial.replace(history)


def verified_outcome(history: Path, local: LocalIndex, scenario: Scenario) -> dict[str, object]:
    """The expected outcome, after checking it is what the engine's replica recorded."""
    outcome = fold_history(read_history(history).events, keyring=keyring_for(history))
    assert not outcome.violations, outcome.violations
    for schedule, judged in ((False, outcome.jobs), (True, outcome.schedules)):
        for key, rows in judged.items():
            got = recorded(local.index_of(key), key, schedule=schedule)
            want = [(row[1], row[3]) for row in rows]
            assert kept(got, rows), f"{key}: the replica recorded {got}, the fold gives {want}"
    for key, rows in outcome.controls.items():
        target, name, partition = key.rsplit(" ", 2)
        got = recorded_control(local.indexes[int(partition[1:])], target, name)
        want = [(row[1], row[3]) for row in rows]
        assert got == want, f"{key}: the replica recorded {got}, the fold gives {want}"
    for key, rows in outcome.limits.items():
        name, partition = key.removeprefix("limit ").rsplit(" ", 1)
        got = recorded_limit(local.indexes[int(partition[1:])], name)
        want = [(row[1], row[3]) for row in rows]
        assert got == want, f"{key}: the replica recorded {got}, the fold gives {want}"
    for key, job in outcome.job_states.items():
        stored_job = local.index_of(key).job(key)
        assert stored_job is not None and avro.encode_state(stored_job) == avro.encode_state(job)
    for key, schedule in outcome.schedule_states.items():
        stored = local.index_of(key).schedule(key)
        assert stored is not None and avro.encode_state(stored) == avro.encode_state(schedule)
    for partition, index in local.indexes.items():  # the newest of each kind (fold version 7)
        poison_check.check_poison(index, outcome, f"the replica's p{partition}")
    return expected_document(outcome, history=history.name, description=scenario.description)


CONTROL_KINDS = frozenset(cls.__name__ for cls in CONTROL_EVENT_TYPES)
LIMIT_KINDS = frozenset(cls.__name__ for cls in LIMIT_EVENT_TYPES)


def recorded_control(index: PartitionIndex, target: str, name: str) -> list[tuple[int, str]]:
    """(offset, verdict) of the pauses and resumes of a queue or schedule in ``index``."""
    if target == "queue":  # the queue's timeline holds its limit's settings too
        stored = [e for e, _ in index.queue_timeline_events(name) if e.kind in CONTROL_KINDS]
    else:
        stored = [e for e in index.timeline(name, schedule=True) if e.kind in CONTROL_KINDS]
    return [(e.offset, e.verdict.value) for e in stored]


def recorded_limit(index: PartitionIndex, name: str) -> list[tuple[int, str]]:
    """(offset, verdict) of a limit's settings (on the queue timeline) and its permit steps (on
    a timeline of their own, fold version 7) in ``index``, in log order."""
    settings = [e for e, _ in index.queue_timeline_events(name) if e.kind in LIMIT_KINDS]
    steps = [e for e, _ in index.permit_timeline_events(name)]
    return [(e.offset, e.verdict.value) for e in sorted(settings + steps, key=lambda e: e.offset)]


def recorded(index: PartitionIndex, key: str, *, schedule: bool) -> list[tuple[int, str]]:
    """(offset, verdict) of ``key``'s events in ``index``: its timeline, or the refused family
    when the id cannot key one (pauses and resumes are compared on their own)."""
    if keyable(key):
        return [
            (e.offset, e.verdict.value)
            for e in index.timeline(key, schedule=schedule)
            if e.kind not in CONTROL_KINDS
        ]
    return [
        (e.offset, e.verdict.value)
        for e, raw in index.refused()
        if entity_id(avro.decode_event(raw)) == key
    ]


def kept(got: list[tuple[int, str]], rows: list[list[object]]) -> bool:
    """Whether an index's timeline ``got`` is what it keeps of the fold's ``rows``: all of them,
    or, after an applied purge, the rows from that purge on (its mark may have expired); and
    rejected events of the job (or schedule) while the index did not hold it, until they
    expired (fold versions 6 and 7)."""
    want = [(int(str(row[1])), str(row[3])) for row in rows]
    orphans = {w for w, row in zip(want, rows, strict=True) if row[4] is None and w[1] != "applied"}
    purges = [i for i, row in enumerate(rows) if row[2] == "JobPurged" and row[3] == "applied"]
    if purges:
        want = want[purges[-1] :]
        if got[:1] != want[:1]:
            want = want[1:]  # the purge's mark expired
    lasting = [w for w in want if w not in orphans]
    return [g for g in got if g not in orphans] == lasting and set(got) <= set(want)


def check_nodes(history: Path, home: Path) -> int:
    """Every node's index (a prefix of the log per partition it held) agrees with the fold."""
    outcome = fold_history(read_history(history).events, keyring=keyring_for(history))
    rows = [(False, k, v) for k, v in outcome.jobs.items()]
    rows += [(True, k, v) for k, v in outcome.schedules.items()]
    checked = 0
    for path in sorted(home.glob("node-*/p*")):
        index = ReadOnlyIndex(path, int(path.name[1:]))
        try:
            applied = index.applied_offset()
            for schedule, key, judged in rows:
                mine = [r for r in judged if r[0] == index.partition and r[1] <= applied]
                got = recorded(index, key, schedule=schedule)
                assert kept(got, mine), f"{path}: {key}: node recorded {got}, the fold gives {mine}"
                checked += len(got)
            checked += poison_check.check_poison(index, outcome, str(path))
        finally:
            index.close()
    return checked


def main() -> None:
    parser = argparse.ArgumentParser(description="Re-record the replay corpus.")
    parser.add_argument("names", nargs="*", choices=[*SCENARIOS, []], default=list(SCENARIOS))
    args = parser.parse_args()
    bootstrap = os.environ.get("EVSCHED_KAFKA_BOOTSTRAP", "127.0.0.1:19092")
    for name in args.names:
        with tempfile.TemporaryDirectory(prefix=f"corpus-{name}-") as home:
            asyncio.run(record(SCENARIOS[name], bootstrap, Path(home)))
    for path in sorted(CORPUS.glob("*.history.avro")):
        print(path.name, hashlib.sha256(path.read_bytes()).hexdigest()[:16])


if __name__ == "__main__":
    main()
