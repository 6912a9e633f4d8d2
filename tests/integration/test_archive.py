"""``evsched archive`` on the real broker: a real archiver SIGKILLed mid-run resumes with every
offset archived exactly once and files byte-identical to a fresh archive; an archive replays like
an export; after ``delete_records`` trimmed the log, audits and rebuilds read the archive first."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer
from tests.conftest import TEST_EVENT_PARTITIONS
from tests.integration.engine import REPO, Operator, Proc, Stack, wait_for

from evsched.adapters.archive.files import listed, partition_events
from evsched.adapters.kafka.partition_log import KafkaPartitionLog
from evsched.adapters.kafka.topics import Topics
from evsched.client import App
from evsched.ports import Record
from evsched.settings import Settings

# Several evsched processes start one after the other; on a loaded machine that takes minutes.
pytestmark = [pytest.mark.broker, pytest.mark.slow, pytest.mark.timeout(600)]
PARTITIONS = range(TEST_EVENT_PARTITIONS)


def archive_stack(bootstrap: str, namespace: str, tmp: Path) -> Stack:
    """The namespace's harness for its processes' environment: no node or worker runs."""
    return Stack(bootstrap, namespace, tmp, partitions=TEST_EVENT_PARTITIONS)


def spawn_archiver(stack: Stack, root: Path, *args: str) -> Proc:
    return stack._spawn(root.name, ["archive", "--to", str(root), *args])


def archive_run(stack: Stack, root: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "evsched", "archive", "--to", str(root), "--once", *args],
        cwd=REPO,
        env=stack.env(),
        capture_output=True,
        timeout=180,
        check=False,
    )


def archive_once(stack: Stack, root: Path, *args: str) -> dict[str, Any]:
    done = archive_run(stack, root, "--json", *args)
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    document: dict[str, Any] = json.loads(done.stdout)
    return document


def tree(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


async def committed_records(settings: Settings) -> list[Record]:
    """Every record of the events topic, read_committed, by (partition, offset)."""
    topic = Topics(settings.namespace).events
    found: list[Record] = []
    async with KafkaPartitionLog(settings, topic, PARTITIONS, client_id="archive-test") as log:
        ends = await log.end_offsets(PARTITIONS)
        starts = await log.start_offsets(PARTITIONS)
        for p in PARTITIONS:
            log.seek(p, starts[p])
            while await log.position(p) < ends[p]:
                batch = await log.read([p], 0.5, 10_000)
                found += [r for r in batch.get(p, []) if r.offset < ends[p]]
    return found


async def transactions(bootstrap: str, topic: str, rounds: int) -> None:
    """Committed and aborted transactions of junk records: markers and aborted offsets as gaps."""
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, transactional_id=f"{topic}.archive-test"
    )
    await producer.start()
    try:
        for i in range(rounds):
            await producer.begin_transaction()
            for p in PARTITIONS:
                await producer.send_and_wait(topic, b"junk-%d" % i, key=b"tx", partition=p)
            if i % 3 == 2:
                await producer.abort_transaction()
            else:
                await producer.commit_transaction()
    finally:
        await producer.stop()


async def enqueue_many(app: App, task: str, count: int, start: int = 0) -> list[str]:
    ids: list[str] = []
    for chunk in range(start, start + count, 50):
        ids += await asyncio.gather(
            *(app.enqueue(task, i) for i in range(chunk, min(chunk + 50, start + count)))
        )
    return ids


def check_exactly_once(root: Path, records: Sequence[Record]) -> None:
    for p in PARTITIONS:
        archived = list(partition_events(root, p))
        logged = [r for r in records if r.partition == p]
        assert [e.offset for e in archived] == [r.offset for r in logged], f"partition {p}"
        assert [(e.key, e.value, e.log_at) for e in archived] == [
            (r.key, r.value, r.log_at) for r in logged
        ]
        offsets = [e.offset for e in archived]
        assert len(offsets) == len(set(offsets))


async def test_a_killed_archiver_resumes_without_gap_or_duplicate(
    kafka_bootstrap: str, namespace: str, tmp_path: Path
) -> None:
    stack = archive_stack(kafka_bootstrap, namespace, tmp_path)
    settings = stack.settings
    topic = Topics(namespace).events
    app = App(settings, name="archive-kill")
    app.task(name="t.archive")(lambda i: None)
    root = tmp_path / "archive"
    roll = ("--roll-records", "20", "--roll-bytes", "4096")
    async with app:
        await enqueue_many(app, "t.archive", 300)
        await transactions(kafka_bootstrap, topic, 6)
        archiver = spawn_archiver(stack, root, *roll, "--tail-s", "0.5", "--log-console")
        produced = 300

        async def sealed_a_few() -> bool:
            # Records keep coming while it runs; it is killed once it has sealed a few files.
            nonlocal produced
            assert archiver.popen.poll() is None, archiver.log()
            if sum(1 for _ in root.rglob("*-*.avro")) >= 15:
                return True
            await enqueue_many(app, "t.archive", 50, produced)
            produced += 50
            return False

        try:
            await wait_for(sealed_a_few, what="the archiver to seal 15 files", timeout_s=300)
            await enqueue_many(app, "t.archive", 100, produced)
            archiver.signal(signal.SIGKILL)
            assert archiver.popen.wait(timeout=30) == -signal.SIGKILL
        finally:
            archiver.kill()
        await transactions(kafka_bootstrap, topic, 3)
        await enqueue_many(app, "t.archive", 100, 10_000)

    resumed = await asyncio.to_thread(archive_once, stack, root, *roll)
    assert any(row["resumed_at"] > 0 for row in resumed["partitions"]), resumed
    assert not list(root.rglob("*.partial"))
    records = await committed_records(settings)
    assert sum(1 for r in records if r.value and r.value.startswith(b"junk")) == 2 * 3 * 3
    check_exactly_once(root, records)
    fresh = tmp_path / "fresh"
    await asyncio.to_thread(archive_once, stack, fresh, *roll)
    assert tree(root) == tree(fresh)
    # Another run with nothing new changes nothing.
    again = await asyncio.to_thread(archive_once, stack, root, *roll)
    assert all(row["files"] == [] for row in again["partitions"]), again
    assert tree(root) == tree(fresh)

    # A running archiver shows new records in tails, and SIGTERM stops it cleanly.
    async with app:
        await enqueue_many(app, "t.archive", 7, 20_000)
    running = spawn_archiver(stack, root, *roll, "--tail-s", "0.5", "--log-console")
    try:
        records = await committed_records(settings)
        last = {p: max(r.offset for r in records if r.partition == p) for p in PARTITIONS}

        async def caught_up() -> bool:
            return all(
                max(f.last for f in listed(root, p)) == last[p] for p in PARTITIONS if last[p]
            )

        await wait_for(caught_up, what="tails of the newest records", timeout_s=120)
        running.signal(signal.SIGTERM)
        assert running.popen.wait(timeout=60) == 0
    finally:
        running.kill()
    check_exactly_once(root, records)
    fresh_again = tmp_path / "fresh-again"
    await asyncio.to_thread(archive_once, stack, fresh_again, *roll)
    assert tree(root) == tree(fresh_again)


async def test_replay_audit_and_rebuild_read_the_archive_of_a_trimmed_log(
    kafka_bootstrap: str, namespace: str, tmp_path: Path
) -> None:
    stack = archive_stack(kafka_bootstrap, namespace, tmp_path)
    settings = stack.settings
    op = Operator(stack)
    app = App(settings, name="archive-read")
    app.task(name="t.read")(lambda i: None)
    async with app:
        jobs = await enqueue_many(app, "t.read", 60)
        for job in jobs[::3]:
            await app.cancel(job, reason="archive test")
        for job in jobs[::9]:
            await app.requeue(job)
        await app.cancel(jobs[3], reason="again")  # rejected: it is cancelled already
    root = tmp_path / "archive"
    await asyncio.to_thread(archive_once, stack, root, "--roll-records", "25")

    # Replay: the archive folds to the outcome recorded from an export of the same log.
    export = tmp_path / "all.history.avro"
    await op.json("export", "-o", str(export))
    code, output = await op.run("replay", str(export), "--update-expected")
    assert code == 0, output
    expected = tmp_path / "all.expected.json"
    (replayed,) = await op.json("replay", "--archive", str(root), "--expected", str(expected))
    assert replayed["identical"] is True and replayed["jobs"] == 60

    job = jobs[0]
    before = await op.json("audit", job)
    rebuilt_before = await op.json(
        "rebuild", "--data-dir", str(tmp_path / "r1"), "--processes", "1"
    )

    # Retention deletes everything archived: a rebuild from the archive is the one from the log.
    topic = Topics(namespace).events
    async with KafkaPartitionLog(settings, topic, PARTITIONS, client_id="archive-test") as log:
        ends = await log.end_offsets(PARTITIONS)
    await stack.trim(ends)
    assert await committed_records(settings) == []
    rebuilt = await op.json(
        "rebuild", "--archive", str(root), "--data-dir", str(tmp_path / "r2"), "--processes", "1"
    )
    digests = [(p["partition"], p["applied_offset"], p["digest"]) for p in rebuilt["partitions"]]
    assert digests == [
        (p["partition"], p["applied_offset"], p["digest"]) for p in rebuilt_before["partitions"]
    ]

    # The job gets one more event, in the log only: the audit reads the archive, then the log.
    async with app:
        await app.cancel(job, reason="after the trim")
    audited = await op.json("audit", job, "--archive", str(root))
    assert audited["events"][: len(before["events"])] == before["events"]
    (last,) = audited["events"][len(before["events"]) :]
    assert last["kind"] == "JobCancelled" and last["verdict"] == "applied"
    assert audited["state"]["status"] == "cancelled"
    assert audited["history"]["log"][0] == ends[audited["partition"]]
    assert audited["history"]["gap"] is None
    offline = await op.json("audit", job, "--archive", str(root), "--offline")
    assert offline["events"] == before["events"] and offline["state"] == before["state"]
    assert offline["history"]["log"] is None
    code, output = await op.run("audit", "no-such-job", "--archive", str(root))
    assert code == 3 and "no events of 'no-such-job' in the archive" in output

    again = await op.json(
        "rebuild", "--archive", str(root), "--data-dir", str(tmp_path / "r3"), "--processes", "1"
    )
    assert again["events"] == rebuilt_before["events"] + 1


async def test_an_archiver_refuses_a_log_trimmed_past_it(
    kafka_bootstrap: str, namespace: str, tmp_path: Path
) -> None:
    stack = archive_stack(kafka_bootstrap, namespace, tmp_path)
    settings = stack.settings
    app = App(settings, name="archive-gap")
    app.task(name="t.gap")(lambda i: None)
    root = tmp_path / "archive"
    async with app:
        await enqueue_many(app, "t.gap", 30)
        await asyncio.to_thread(archive_once, stack, root, "--roll-records", "5")
        await enqueue_many(app, "t.gap", 30, 100)
    topic = Topics(namespace).events
    async with KafkaPartitionLog(settings, topic, PARTITIONS, client_id="archive-test") as log:
        ends = await log.end_offsets(PARTITIONS)
    await stack.trim(ends)

    done = await asyncio.to_thread(archive_run, stack, root)
    assert done.returncode == 1, done.stderr.decode()
    assert "--accept-gap" in done.stderr.decode()
    accepted = await asyncio.to_thread(archive_once, stack, root, "--accept-gap")
    for row in accepted["partitions"]:
        assert row["resumed_at"] == ends[row["partition"]]
