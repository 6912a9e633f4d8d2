"""Read replicas' indexes made usable before they follow the log: restored from the changelog.

The API's replica and the operator's local replica hold every partition. Before folding, each
partition's local index is checked against the events log's start and the changelog
(``runtime.projection.changelog_restore.plan_open``): restored from the changelog when it is
missing and far behind, of another fold version, or behind a trimmed log; deleted (and so refolded
from offset
0) when another fold version built it over a whole log; refused, with the reason, when no source
holds its history. Replicas never write the changelog.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import structlog

from evsched.adapters.kafka.partition_log import KafkaPartitionLog
from evsched.adapters.kafka.topics import Topics, partition_count
from evsched.core.fold import FOLD_VERSION
from evsched.ports import PartitionLog
from evsched.runtime.projection.changelog import RESTORE_FETCH, latest_meta
from evsched.runtime.projection.changelog_restore import (
    RESTORE_AHEAD_RECORDS,
    Action,
    LocalIndex,
    local_index,
    plan_open,
    restore_partition,
)
from evsched.runtime.projection.restore import index_path
from evsched.settings import Settings

log = structlog.get_logger("evsched.replica")


@dataclass(slots=True)
class Prepared:
    """What preparing a replica's indexes found: the partitions refused, and why."""

    refused: dict[int, str] = field(default_factory=dict)


async def prepare_indexes(
    settings: Settings,
    data_dir: Path,
    partitions: int,
    *,
    client_id: str,
    events: PartitionLog | None = None,
) -> Prepared:
    """Make every partition's index under ``data_dir`` usable, or say why it cannot be.

    ``events``: a started reader of the events topic to ask for its offsets (else one is opened).
    """
    topics = Topics(settings.namespace)
    every = range(partitions)
    if events is None:
        async with KafkaPartitionLog(settings, topics.events, every, client_id=client_id) as own:
            starts, ends = await own.start_offsets(every), await own.end_offsets(every)
    else:
        starts, ends = await events.start_offsets(every), await events.end_offsets(every)
    locals_ = {p: local_index(data_dir, p) for p in every}
    if not any(worth_a_look(locals_[p], starts[p], ends[p]) for p in every):
        return Prepared()  # every index reaches the log's start and is close to its end: fold on
    if not await _has_changelog(settings, topics.state):
        # A namespace no node of this version provisioned yet: no snapshot to restore from.
        return await prepare_partitions(None, data_dir, locals_, starts)
    async with KafkaPartitionLog(
        settings, topics.state, every, client_id=f"{client_id}-restore", **RESTORE_FETCH
    ) as state:
        return await prepare_partitions(state, data_dir, locals_, starts)


async def prepare_partitions(
    state: PartitionLog | None,
    data_dir: Path,
    locals_: Mapping[int, LocalIndex],
    starts: Mapping[int, int],
) -> Prepared:
    """Each partition's ``plan_open`` carried out; ``state`` reads the changelog (None: none)."""
    done = Prepared()
    for partition, local in locals_.items():
        meta = None if state is None else await latest_meta(state, partition)
        plan = plan_open(local, log_start=starts[partition], meta=meta)
        if plan.action is Action.RESTORE:
            assert state is not None  # a plan restores only from a snapshot it saw
            restored = await restore_partition(
                state, data_dir, partition, log_start=starts[partition]
            )
            log.info(
                "replica_partition_restored",
                partition=partition,
                applied_offset=restored.applied_offset,
            )
        elif plan.action is Action.REBUILD:
            shutil.rmtree(index_path(data_dir, partition))
            log.info("replica_partition_reset", partition=partition, reason="fold_version")
        elif plan.action is Action.REFUSE:
            done.refused[partition] = plan.reason
            log.error("replica_partition_refused", partition=partition, reason=plan.reason)
    return done


async def _has_changelog(settings: Settings, topic: str) -> bool:
    try:
        await partition_count(settings.bootstrap, topic, **dict(settings.kafka_options))
    except Exception as exc:  # missing, or not allowed: either way there is none to read
        log.warning("replica_no_changelog", topic=topic, error=repr(exc))
        return False
    return True


def worth_a_look(local: LocalIndex, log_start: int, log_end: int) -> bool:
    """Whether the changelog may change what is done with this index (else it is folded on)."""
    if local.fold_version not in (None, FOLD_VERSION) or local.applied_offset + 1 < log_start:
        return True
    return log_end - (local.applied_offset + 1) > RESTORE_AHEAD_RECORDS
