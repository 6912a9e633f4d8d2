"""Memory of a node's partition indexes as jobs accumulate, without a broker: fold a generated
no-op history into ``--partitions`` indexes in this process and sample RSS at each stage.

Each job is the four events a no-op job makes (JobEnqueued, JobLeased, AttemptStarted,
AttemptSucceeded), Avro-encoded as producers write them. Jobs go in chunks of ``--chunk``; a
chunk's events are folded one kind at a time, one projector step per partition and kind, which
is how a node sees them (a lease, start or success lands in a later step than the state it
changes). Besides RSS it prints RocksDB's own view of its memory, summed over every column family
of every index: memtables, table readers (index and filter blocks held outside the block cache)
and block cache usage (a cache shared by several families is counted once per family).

This is the cheap way to 1M jobs in an index (minutes instead of a 15-minute run through
broker, node and worker; ``bench/e2e.py --rss`` is that run). It measures the same index and
projector code as a node, but not the node's Kafka clients. The last line is
``rss_mb=<a>,<b>,... rss_change_pct=<first to last stage>``.

Run: ``.venv/bin/python bench/index_memory.py --stages 100000,1000000``.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
import uuid
import zlib
from pathlib import Path

from evsched.adapters import avro
from evsched.adapters.index.store import COLUMN_FAMILIES, PartitionIndex
from evsched.core import events as ev
from evsched.ports import Record
from evsched.runtime.projection.projector import Projector

T0 = 1_767_225_600_000
PROPERTIES = {
    "memtables": "rocksdb.cur-size-all-mem-tables",
    "table_readers": "rocksdb.estimate-table-readers-mem",
    "block_cache": "rocksdb.block-cache-usage",
}


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def job_events(job_id: str, at: int) -> list[ev.JobEvent]:
    def common(source: str) -> dict[str, object]:
        return {"event_id": str(uuid.uuid4()), "job_id": job_id, "emitted_at": at, "source": source}

    return [
        ev.JobEnqueued(
            **common("client"),  # type: ignore[arg-type]
            task="bench.noop",
            queue="default",
            args=b"[[],{}]",
            body_digest=bytes(32),
        ),
        ev.JobLeased(**common("node-n1"), token=1, attempt=1, lease_ms=30_000),  # type: ignore[arg-type]
        ev.AttemptStarted(
            **common("worker-w1"),  # type: ignore[arg-type]
            token=1,
            worker_id="vm-1234-abcdef",
            lease_ms=30_000,
        ),
        ev.AttemptSucceeded(**common("worker-w1"), token=1, result=b"null"),  # type: ignore[arg-type]
    ]


class Indexes:
    """``partitions`` indexes and projectors, fed as a node's steps would feed them."""

    def __init__(self, root: Path, partitions: int) -> None:
        self.indexes = [PartitionIndex(root / f"p{p:04d}", p) for p in range(partitions)]
        self.projectors = [Projector(index) for index in self.indexes]
        self.offsets = [0] * partitions

    def add_chunk(self, jobs: list[str], at: int) -> None:
        history = [job_events(job_id, at) for job_id in jobs]
        parts = len(self.indexes)
        for kind in range(4):
            steps: list[list[Record]] = [[] for _ in range(parts)]
            for job_id, events in zip(jobs, history, strict=True):
                p = zlib.crc32(job_id.encode()) % parts
                value = avro.encode_event(events[kind])
                steps[p].append(Record("b.events", p, self.offsets[p], at + kind, None, value))
                self.offsets[p] += 1
            for projector, records in zip(self.projectors, steps, strict=True):
                if records:
                    projector.commit(projector.fold(records))

    def rocksdb_mb(self) -> dict[str, float]:
        return {
            name: sum(
                index._cf[cf].property_int_value(prop) or 0
                for index in self.indexes
                for cf in COLUMN_FAMILIES
            )
            / 2**20
            for name, prop in PROPERTIES.items()
        }

    def close(self) -> None:
        for index in self.indexes:
            index.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--stages", default="100000,1000000", help="jobs in the indexes per sample")
    p.add_argument("--partitions", type=int, default=6)
    p.add_argument("--chunk", type=int, default=600, help="jobs folded together")
    args = p.parse_args()
    root = Path(tempfile.mkdtemp(prefix="evsched-index-memory-"))
    indexes = Indexes(root, args.partitions)
    samples: list[float] = []
    done, started = 0, time.monotonic()
    print(f"start: rss={rss_mb():.1f} MB")
    try:
        for stage in (int(s) for s in args.stages.split(",")):
            while done < stage:
                count = min(args.chunk, stage - done)
                indexes.add_chunk([str(uuid.uuid4()) for _ in range(count)], T0 + done)
                done += count
            samples.append(rss_mb())
            parts = " ".join(f"{k}={v:.1f}" for k, v in indexes.rocksdb_mb().items())
            took = time.monotonic() - started
            print(f"{done} jobs: rss={samples[-1]:.1f} MB rocksdb_mb {parts} ({took:.0f} s)")
    finally:
        indexes.close()
        shutil.rmtree(root, ignore_errors=True)
    change = (samples[-1] - samples[0]) / samples[0] * 100
    print(f"rss_mb={','.join(f'{s:.1f}' for s in samples)} rss_change_pct={change:+.1f}")


if __name__ == "__main__":
    main()
