"""Take-over by restore from the changelog against a full refold of one partition, on a broker.

One partition of ``<ns>.events`` gets a generated log (``bench/histories.py``, as
``bench/rebuild.py`` makes it: ``--events`` / 4.4 jobs, by default about 450k jobs and 2.6M
events) with the purges a node writes under a retention of ``--retention-ms`` of log time (60 s
by default): each finished job's ``JobPurged``, planned by the node's planner, when log time
passes its retention. Jobs arrive one per millisecond of log time, so about 60k jobs are live
(not purged) at the end, and the log holds some 3M records. Its index as of ``--tail`` records
before the end is written to the compacted ``<ns>.state`` in the changelog's wire format, with
its meta record: what compaction leaves of a node's transactions there, the live keys only (the
live jobs with their timelines and keys, and the marks of the purges still kept for audits; a
purged job left tombstones, which compaction drops). Then, interleaved ``--rounds`` times:

- **refold**: a fresh index folded from offset 0 to the end (what a take-over did before the
  changelog, and still does on a short log);
- **restore**: the changelog partition loaded into a fresh index (``restore_partition``), then
  the log's last ``--tail`` records folded on top: a take-over's time to a caught-up index.

With ``--standby``, each round also times a **standby** take-over (``evsched node --standby``):
the index a standby keeps warm, ``--standby-lag`` records behind the end (a copy of the
snapshot's index brought there untimed), opened as an owner opens it and the short tail folded.

All must give the same digest. Reported: live jobs and changelog records against log records,
records/s of the restore, take-over seconds both ways and their ratio. The refold's time grows
with the log (history); the restore's with the changelog (live jobs): ``--retention-ms off``
generates the log without purges, where every job stays live and the changelog holds more
records than the log. The last line is ``key=value`` pairs.

Run: ``EVSCHED_KAFKA_BOOTSTRAP=host:port .venv/bin/python bench/restore.py [--events 2000000]
[--retention-ms 60000]``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from evsched.adapters.index.store import PartitionIndex
from evsched.adapters.kafka.partition_log import KafkaPartitionLog
from evsched.core.fold import FOLD_VERSION
from evsched.operator.rebuild import PartitionPlan, rebuild_one
from evsched.ports import Outgoing
from evsched.runtime.projection.changelog import META_FORMAT, ChangelogWriter, Meta
from evsched.runtime.projection.changelog_restore import restore_partition
from evsched.runtime.projection.projector import Projector
from evsched.runtime.projection.restore import restore
from evsched.settings import Settings
from rebuild import log_ends, produce

EVENTS_PER_JOB = 4.4  # what the generated histories average, purges aside (one per purged job)
RETENTION_MS = 60_000  # at a job per millisecond of log time: about 60k live jobs at the end


def state_topic(settings: Settings) -> str:
    """The changelog's topic: one per format, so runs of the code before a format change (their
    log generated once) and after it write changelogs of their own beside the same log."""
    return f"{settings.namespace}.state" + ("" if META_FORMAT == 1 else f".f{META_FORMAT}")


def changelog_records(index: PartitionIndex, topic: str) -> tuple[list[Outgoing], Counter[str]]:
    """What compaction leaves of the index's changelog: a record per live job (its state and
    timeline) and per other mirrored key (a purge's deletes were tombstones), and the meta
    record; and the records per family (``job`` for the jobs' records)."""
    writer = ChangelogWriter(topic, 0)
    records = [*writer.snapshot(index)]
    families = Counter(key.partition(b"\x00")[0].decode() for r in records if (key := r.key))
    records.append(writer.meta(Meta(index.applied_offset(), FOLD_VERSION)))
    return records, families


async def write_changelog(bootstrap: str, records: list[Outgoing]) -> None:
    """``records`` on their compacted topic, created when missing."""
    topic = records[0].topic
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        if topic not in await admin.list_topics():
            configs = {"cleanup.policy": "compact"}
            await admin.create_topics([NewTopic(topic, 1, 1, topic_configs=configs)])
    finally:
        await admin.close()
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, acks=1, linger_ms=50, max_batch_size=1 << 20
    )
    await producer.start()
    try:
        pending = []
        for o in records:
            pending.append(await producer.send(topic, o.value, key=o.key, partition=0))
            if len(pending) >= 20_000:
                await asyncio.gather(*pending)
                pending.clear()
        await asyncio.gather(*pending)
    finally:
        await producer.stop()


def refold(bootstrap: str, namespace: str, until: int, directory: Path) -> tuple[float, str]:
    plan = PartitionPlan(
        bootstrap=bootstrap, namespace=namespace, partition=0, until=until, directory=directory
    )
    started = time.perf_counter()
    result = rebuild_one(plan)
    return time.perf_counter() - started - result.digest_s, result.digest


async def take_over(settings: Settings, end: int, data_dir: Path) -> dict[str, Any]:
    """Restore the changelog into ``data_dir``, then fold the log's tail: a take-over."""
    started = time.perf_counter()
    async with KafkaPartitionLog(
        settings,
        state_topic(settings),
        [0],
        client_id="bench-restore",
        max_partition_fetch_bytes=16 << 20,
        fetch_max_bytes=64 << 20,
    ) as state:
        meta = await restore_partition(state, data_dir, 0, log_start=0)
    restored = time.perf_counter()
    index = PartitionIndex(data_dir / "p0000", 0)
    try:
        async with KafkaPartitionLog(
            settings, f"{settings.namespace}.events", [0], client_id="bench-tail"
        ) as events:
            tail = await restore(events, {0: Projector(index)}, {0: end})
        digest = index.digest()
    finally:
        index.close()
    return {
        "restore_s": restored - started,
        "takeover_s": time.perf_counter() - started,
        "snapshot_offset": meta.applied_offset,
        "tail": tail,
        "digest": digest,
    }


async def standby_take_over(
    settings: Settings, end: int, lag: int, snapshot: Path, data_dir: Path
) -> dict[str, Any]:
    """A standby's warm copy, ``lag`` records behind ``end``: opened and the tail folded."""
    shutil.copytree(snapshot, data_dir)
    async with KafkaPartitionLog(
        settings, f"{settings.namespace}.events", [0], client_id="bench-standby"
    ) as events:
        index = PartitionIndex(data_dir, 0)
        try:  # what the standby folded before the owner died: not part of the take-over
            await restore(events, {0: Projector(index)}, {0: max(0, end - lag)})
        finally:
            index.close()
        started = time.perf_counter()
        index = PartitionIndex(data_dir, 0)
        try:
            tail = await restore(events, {0: Projector(index)}, {0: end})
            took = time.perf_counter() - started
            digest = index.digest()
        finally:
            index.close()
    return {"takeover_s": took, "tail": tail, "digest": digest}


def retention(text: str) -> int | None:
    """``--retention-ms``: milliseconds of log time, or ``off`` for a log without purges."""
    if text == "off":
        return None
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is neither a number of milliseconds nor off")
    return int(text)


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=2_000_000, help="Events before purges.")
    parser.add_argument("--tail", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--retention-ms",
        type=retention,
        default=RETENTION_MS,
        help="The jobs' retention in log time (off: no purges, every job stays live).",
    )
    parser.add_argument("--standby", action="store_true", help="Also time a standby take-over.")
    parser.add_argument("--standby-lag", type=int, default=200, help="The standby copy's lag.")
    return parser.parse_args()


async def the_log(settings: Settings, jobs: int, seed: int, retention_ms: int | None) -> int:
    """The end offset of the namespace's one events partition, generated unless it exists."""
    topic = f"{settings.namespace}.events"
    ends = await log_ends(settings.bootstrap, topic, 1)
    if ends is None:
        await produce(settings.bootstrap, topic, jobs, 1, seed, retention_ms=retention_ms)
        ends = await log_ends(settings.bootstrap, topic, 1)
    assert ends is not None
    return ends[0]


def snapshot(settings: Settings, at: int, directory: Path) -> tuple[int, int, Counter[str]]:
    """The index as of offset ``at`` written to the changelog: live jobs, records, families."""
    refold(settings.bootstrap, settings.namespace, at, directory)
    index = PartitionIndex(directory, 0)
    try:
        live_jobs = sum(1 for _ in index.jobs())
        records, families = changelog_records(index, state_topic(settings))
    finally:
        index.close()
    asyncio.run(write_changelog(settings.bootstrap, records))
    return live_jobs, len(records), families


def main() -> None:
    args = arguments()
    bootstrap = os.environ.get("EVSCHED_KAFKA_BOOTSTRAP", "127.0.0.1:19092")
    jobs = max(1, round(args.events / EVENTS_PER_JOB))
    shown = "off" if args.retention_ms is None else args.retention_ms
    kept = "" if args.retention_ms is None else f"-r{args.retention_ms}"
    namespace = f"benchrestore-{jobs}-{args.tail}-{args.seed}{kept}"
    settings = Settings(bootstrap=bootstrap, namespace=namespace, event_partitions=1)
    end = asyncio.run(the_log(settings, jobs, args.seed, args.retention_ms))
    work = Path(tempfile.mkdtemp(prefix="evsched-restore-"))
    try:
        at = max(0, end - args.tail) - 1
        live_jobs, written, families = snapshot(settings, at, work / "snapshot")
        print(
            f"log: {end} records of {jobs} jobs (retention_ms {shown}); "
            f"index at offset {at}: {live_jobs} live jobs; changelog: {written} records "
            f"({written / end:.1%} of the log: "
            + ", ".join(f"{n} {family}" for family, n in families.most_common())
            + ", 1 meta)"
        )
        lag = args.standby_lag if args.standby else None
        pairs = measure(args.rounds, settings, end, work, lag)
        pairs.update(events=end, jobs=jobs, live_jobs=live_jobs, changelog_records=written)
        pairs["retention_ms"] = shown
        pairs["restore_records_per_s"] = round(written / pairs["restore_s"])
        pairs["load_avg_1m"] = round(os.getloadavg()[0], 2)
        print(" ".join(f"{k}={v}" for k, v in pairs.items()))
    finally:
        shutil.rmtree(work, ignore_errors=True)


def measure(
    rounds: int, settings: Settings, end: int, work: Path, standby_lag: int | None = None
) -> dict[str, Any]:
    """Refold and take-over, interleaved; the best of each (other load only slows them).

    ``standby_lag``: also a standby's take-over from a copy that many records behind the end.
    """
    refolds, takeovers, restores, standbys, same = [], [], [], [], True
    for round_ in range(rounds):
        refold_s, full = refold(
            settings.bootstrap, settings.namespace, end - 1, work / f"refold-{round_}"
        )
        taken = asyncio.run(take_over(settings, end, work / f"takeover-{round_}"))
        same = same and taken["digest"] == full
        if standby_lag is not None:
            warm = asyncio.run(
                standby_take_over(
                    settings, end, standby_lag, work / "snapshot", work / f"standby-{round_}"
                )
            )
            same = same and warm["digest"] == full
            standbys.append(warm["takeover_s"])
            print(
                f"round {round_ + 1}: standby take-over {warm['takeover_s']:.3f} s "
                f"({warm['tail']} records of tail)"
            )
        refolds.append(refold_s)
        takeovers.append(taken["takeover_s"])
        restores.append(taken["restore_s"])
        print(
            f"round {round_ + 1}: refold {refold_s:.1f} s, take-over {taken['takeover_s']:.1f} s "
            f"(restore {taken['restore_s']:.1f} s, then {taken['tail']} records of tail)"
        )
    found: dict[str, Any] = {}
    if standbys:
        found["standby_takeover_s"] = round(min(standbys), 3)
        found["standby_speedup"] = round(min(refolds) / min(standbys), 1)
    return {
        **found,
        "refold_s": round(min(refolds), 2),
        "takeover_s": round(min(takeovers), 2),
        "restore_s": round(min(restores), 2),
        "speedup": round(min(refolds) / min(takeovers), 2),
        "digest_match": str(same).lower(),
    }


if __name__ == "__main__":
    main()
