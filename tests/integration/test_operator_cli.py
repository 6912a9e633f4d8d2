"""The operator commands against a running engine (node and worker processes on the broker):
writes report the fold's verdict, reads catch a local replica up first, exports are byte for byte
reproducible, and a rebuild of the log matches the live node's index digest."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from tests.integration.engine import Operator, Stack
from tests.integration.stacks import node_and_worker

from evsched.adapters.archive.history_file import iter_history
from evsched.core.state import Status

pytestmark = [pytest.mark.broker, pytest.mark.slow]


@pytest_asyncio.fixture
async def stack(kafka_bootstrap: str, tmp_path: Path) -> AsyncIterator[Stack]:
    async with node_and_worker(kafka_bootstrap, "op", tmp_path) as engine:
        yield engine


async def test_writes_report_verdicts_and_reads_see_them(stack: Stack) -> None:
    op = Operator(stack)
    (written,) = await op.json("enqueue", "s.effect", '["hello"]')
    assert (written["kind"], written["verdict"]) == ("JobEnqueued", "applied")
    job_id = written["id"]
    await stack.wait_status(job_id, Status.SUCCEEDED)

    audit = await op.json("audit", job_id)
    assert [e["kind"] for e in audit["events"]] == [
        "JobEnqueued",
        "JobLeased",
        "AttemptStarted",
        "AttemptSucceeded",
    ]
    assert {e["verdict"] for e in audit["events"]} == {"applied"}
    assert audit["events"][-1]["reading"].endswith("1 effect committed")
    state = await op.json("job", job_id)
    assert state["status"] == "succeeded" and state["result"] == "hello"

    (later,) = await op.json("enqueue", "s.noop", "--delay-s", "3600")
    (cancelled,) = await op.json("cancel", later["id"])
    assert cancelled["verdict"] == "applied"
    (again,) = await op.json("cancel", later["id"], code=5)
    assert again["reading"] == "cancel from client rejected: job is already cancelled"
    assert (await op.run("cancel", "no-such-job"))[0] == 3
    (requeued,) = await op.json("requeue", later["id"])
    assert requeued["verdict"] == "applied"
    await stack.wait_status(later["id"], Status.SUCCEEDED)


async def test_dead_letters_and_schedules(stack: Stack) -> None:
    op = Operator(stack)
    (doomed,) = await op.json("enqueue", "s.permanent")
    await stack.wait_status(doomed["id"], Status.DEAD)
    dead = await op.json("dlq", "list")
    assert [job["job_id"] for job in dead] == [doomed["id"]]
    (requeued,) = await op.json("dlq", "requeue", "--all")
    assert (requeued["id"], requeued["verdict"]) == (doomed["id"], "applied")

    (upserted,) = await op.json("schedules", "upsert", "nightly", "0 3 * * *", "s.noop")
    assert upserted["verdict"] == "applied" and "next slot" in upserted["reading"]
    listed = await op.json("schedules", "list")
    assert [(s["schedule_id"], s["cron"]) for s in listed] == [("nightly", "0 3 * * *")]
    (deleted,) = await op.json("schedules", "delete", "nightly")
    assert deleted["verdict"] == "applied"
    assert await op.json("schedules", "list") == []


async def test_exports_are_reproducible_and_a_rebuild_matches_the_live_index(
    stack: Stack, tmp_path: Path
) -> None:
    op = Operator(stack)
    jobs = [(await op.json("enqueue", "s.effect", f'["{i}"]', "--no-wait"))[0] for i in range(30)]
    for job in jobs:
        await stack.wait_status(job["id"], Status.SUCCEEDED)
    for partition in range(stack.partitions):  # the node has folded what it acted on
        ends = [j["offset"] for j in jobs if j["partition"] == partition]
        if ends:
            await stack.wait_node_past(partition, max(ends))

    first, second = tmp_path / "one.avro", tmp_path / "two.avro"
    for path in (first, second):
        document = await op.json("export", "-o", str(path))
        assert document["events"] >= 30 * 4
    assert first.read_bytes() == second.read_bytes()
    ranged = await op.json(
        "export", "-o", str(tmp_path / "r.avro"), "--partition", "0", "--from", "0", "--to", "2"
    )
    # Offsets 0..2 hold three records, or fewer when a node's transaction marker took one.
    within = [e for e in iter_history(first) if e.partition == 0 and e.offset <= 2]
    assert 2 <= len(within) == ranged["events"]
    assert [e.offset for e in iter_history(tmp_path / "r.avro")] == [e.offset for e in within]

    live = stack.node_data("node-1")
    rebuilt = str(tmp_path / "rebuilt")
    code, output = await op.run(
        "rebuild", "--verify", "--live-dir", str(live), "--data-dir", rebuilt, "--processes", "1"
    )
    assert code == 0, output
    assert output.strip().splitlines()[-1].startswith("digest_match=true events_per_s=")
    document = await op.json(
        "rebuild",
        "--verify",
        "--live-dir",
        str(live),
        "--data-dir",
        str(tmp_path / "rebuilt"),
        "--replace",
        "--processes",
        "2",
    )
    assert document["digest_match"] is True
    assert all(p["digest"] == p["live_digest"] for p in document["partitions"])
