"""Bytes per job on the log and in the index, with retention, measured through a real partition.

Runs ``--jobs`` no-op jobs through ``testing.NodeDriver`` (the node's own partition runner over a
temp RocksDB index, with an in-memory broker and a frozen clock), each with a retention of
``--retention-s``. It prints:

- ``log_bytes_per_job``: key + value bytes of every ``<ns>.events`` record per job, by kind
  (JobEnqueued, JobLeased, AttemptStarted, AttemptSucceeded, JobPurged): what the log holds per
  job before replication and compression;
- ``index_bytes_per_finished_job``: key + value bytes of every index entry per finished job
  still within its retention (state, timeline with the events' bytes, key, purge time);
- ``index_bytes_per_purge_mark``: what a purged job leaves until its mark expires;
- ``index_bytes_after``: what is left once every retention and mark ran out (flat: 0 per job);
- ``changelog_written_bytes_per_job``: key + value bytes the node's transactions wrote to the
  compacted ``<ns>.state`` topic per job, before compaction (what the brokers take in);
- ``changelog_compacted_bytes_per_finished_job``, ``..._per_purge_mark``, ``changelog_bytes_after``:
  what the topic holds once compacted (the newest non-tombstone record per key) at the same three
  points (tombstones themselves go after the topic's ``delete.retention.ms``).

Logical bytes (RocksDB's on-disk size adds block overhead and compression). Dispatch and
effects records are not counted. Run: ``.venv/bin/python bench/retention_sizes.py --jobs 2000``.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
from collections import Counter
from pathlib import Path

from evsched.adapters import avro
from evsched.adapters.index.store import DIGEST_FAMILIES, PartitionIndex
from evsched.core.events import AttemptStarted, AttemptSucceeded, JobEnqueued
from evsched.core.planner import PlannerBudgets
from evsched.ports import Record
from evsched.testing import NodeDriver

# Every job leased in one go, and no lease expiring while the clock jumps over the retention.
BUDGETS = PlannerBudgets(
    dispatch_timeout_ms=3_600_000, max_in_flight_per_queue=10**9, max_unstarted_per_queue=10**9
)


def index_bytes(index: PartitionIndex) -> int:
    return sum(len(k) + len(v) for name in DIGEST_FAMILIES for k, v in index.scan(name))


def compacted_bytes(records: list[Record]) -> int:
    """What a compacted topic keeps of ``records``: the newest value per key, tombstones gone."""
    newest: dict[bytes | None, bytes | None] = {}
    for record in records:
        newest[record.key] = record.value
    return sum(len(k or b"") + len(v) for k, v in newest.items() if v is not None)


def enqueue(n: int, retention_ms: int) -> JobEnqueued:
    return JobEnqueued(
        event_id=f"00000000-0000-4000-8000-{n:012d}", job_id=f"10000000-0000-4000-8000-{n:012d}",
        emitted_at=0, source="client", task="bench.noop", queue="default",
        args=b'{"args":[],"kwargs":{}}', retention_ms=retention_ms,
    )  # fmt: skip


async def measure(jobs: int, retention_ms: int, home: Path) -> dict[str, float]:
    driver = NodeDriver(home, budgets=BUDGETS, max_records=100_000, scan_limit=100_000)
    try:
        driver.append(*(enqueue(n, retention_ms) for n in range(jobs)))
        await driver.settle()
        for d in driver.dispatched():
            driver.append(
                AttemptStarted(event_id=f"s-{d.job_id}", job_id=d.job_id, emitted_at=0,
                               source="worker-1", token=d.token, worker_id="w1", lease_ms=60_000),
                AttemptSucceeded(event_id=f"o-{d.job_id}", job_id=d.job_id, emitted_at=0,
                                 source="worker-1", token=d.token, result=b"null"),
            )  # fmt: skip
        await driver.settle()
        index = driver.owner.index
        finished = index_bytes(index) / jobs
        changelog_finished = compacted_bytes(driver.changelog()) / jobs
        driver.advance(retention_ms / 1000)
        await driver.settle()
        marks = index_bytes(index) / jobs
        changelog_marks = compacted_bytes(driver.changelog()) / jobs
        driver.append(enqueue(jobs, 0))  # one more job, purged later than every mark's time
        driver.advance(retention_ms / 1000)
        await driver.settle()
        dispatch = driver.dispatched()[-1]
        driver.append(
            AttemptStarted(event_id="s-last", job_id=dispatch.job_id, emitted_at=0,
                           source="worker-1", token=dispatch.token, worker_id="w1", lease_ms=1),
            AttemptSucceeded(event_id="o-last", job_id=dispatch.job_id, emitted_at=0,
                             source="worker-1", token=dispatch.token, result=b"null"),
        )  # fmt: skip
        await driver.settle()
        by_kind: Counter[str] = Counter()
        for record in driver.log():
            kind = type(avro.decode_event(record.value or b"")).__name__
            by_kind[kind] += len(record.value or b"") + len(record.key or b"")
        after = index_bytes(index)
        changelog = driver.changelog()
    finally:
        driver.close()
    result = {f"log_{kind}": total / jobs for kind, total in sorted(by_kind.items())}
    result["log_bytes_per_job"] = sum(by_kind.values()) / jobs
    result["index_bytes_per_finished_job"] = finished
    result["index_bytes_per_purge_mark"] = marks
    result["index_bytes_after"] = after
    result["changelog_written_bytes_per_job"] = (
        sum(len(r.key or b"") + len(r.value or b"") for r in changelog) / jobs
    )
    result["changelog_compacted_bytes_per_finished_job"] = changelog_finished
    result["changelog_compacted_bytes_per_purge_mark"] = changelog_marks
    result["changelog_bytes_after"] = compacted_bytes(changelog)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2_000)
    parser.add_argument("--retention-s", type=float, default=120.0)
    options = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="evsched-retention-") as home:
        found = asyncio.run(measure(options.jobs, int(options.retention_s * 1000), Path(home)))
    for name, value in found.items():
        print(f"{name}={value:.0f}")


if __name__ == "__main__":
    main()
