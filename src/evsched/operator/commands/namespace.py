"""``evsched namespace migrate --to NEW_NS [--partitions N]``: carry the namespace's live jobs and
schedules into a new namespace (e.g. one with more events partitions), exactly once.

Each job's pair of events (enqueued in the new namespace with its id, cancelled in the old one
with "moved to namespace NEW_NS") goes out in one Kafka transaction, so a job is never in both
namespaces or in neither; a repeated run writes duplicates only. What is carried, and why leased,
running and waiting jobs are left for a later run: ``core.migration``; the procedure:
docs/operations.md, "Growing a namespace".
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Annotated

import typer

from evsched.adapters.clock import now_ms
from evsched.adapters.kafka.clients import KafkaError
from evsched.adapters.kafka.migration import write_atomically
from evsched.adapters.kafka.topics import (
    TopicProvisioningError,
    Topics,
    ensure_topics,
    partition_count,
)
from evsched.commands import encode_checked
from evsched.core import migration
from evsched.core.bounds import namespace_refusal
from evsched.core.controls import QUEUE
from evsched.core.events import Event, entity_id
from evsched.operator.exits import ExitCode, OperatorError
from evsched.operator.render import emit_json, out
from evsched.operator.replica_dir import DEFAULT_TIMEOUT_S, LocalIndex
from evsched.operator.session import (
    DEFAULT_DATA_DIR,
    DataDir,
    Json,
    ReplicaOptions,
    TimeoutS,
    replica,
    run,
)
from evsched.ports import Outgoing
from evsched.settings import Settings

To = Annotated[str, typer.Option("--to", help="The namespace to move into ([A-Za-z0-9._-]).")]
Partitions = Annotated[
    int | None,
    typer.Option(
        "--partitions",
        min=1,
        max=10_000,
        help="Events partitions of the new namespace. [default: EVSCHED_EVENT_PARTITIONS]",
        show_default=False,
    ),
]
DryRun = Annotated[bool, typer.Option("--dry-run", help="Show what would move; write nothing.")]


def namespace_app() -> typer.Typer:
    namespace = typer.Typer(no_args_is_help=True, help="The namespace: move it into a new one.")
    namespace.command("migrate")(namespace_migrate)
    return namespace


def paused_queues(local: LocalIndex) -> set[tuple[int, str]]:
    """(partition, queue) of every queue paused on a partition, as the replica has folded it."""
    return {
        (partition, state.name)
        for partition, index in local.indexes.items()
        for state in index.controls()
        if state.target == QUEUE and state.paused
    }


def read_plan(local: LocalIndex, to_namespace: str) -> migration.Plan:
    jobs = (state for index in local.indexes.values() for state in index.jobs())
    schedules = (state for index in local.indexes.values() for state in index.schedules())
    return migration.plan(
        jobs, schedules, paused=paused_queues(local), to_namespace=to_namespace, now_ms=now_ms()
    )


def _record(topics: Topics, event: Event) -> Outgoing:
    return Outgoing(topic=topics.events, key=entity_id(event).encode(), value=encode_checked(event))


def pairs(plan: migration.Plan, old: Topics, new: Topics) -> list[list[Outgoing]]:
    """Schedules first (a slot the old namespace fires before its delete is a job carried by a
    later run), then jobs; each move's new record first, then the old one's."""
    moves: list[tuple[Event, Event]] = [(m.upserted, m.deleted) for m in plan.schedules]
    moves += [(m.enqueued, m.cancelled) for m in plan.jobs]
    return [[_record(new, carried), _record(old, ended)] for carried, ended in moves]


def queues_of(plan: migration.Plan) -> list[str]:
    used = {m.enqueued.queue for m in plan.jobs}
    return sorted(used | {m.upserted.template.queue for m in plan.schedules})


def summary(plan: migration.Plan, *, old: str, new: str, written: bool) -> dict[str, object]:
    left = Counter(str(state.status) for state in plan.left)
    return {
        "from": old,
        "to": new,
        "written": written,
        "jobs": len(plan.jobs),
        "schedules": len(plan.schedules),
        "left": dict(sorted(left.items())),
    }


def namespace_migrate(
    *,
    to: To,
    partitions: Partitions = None,
    dry_run: DryRun = False,
    data_dir: DataDir = DEFAULT_DATA_DIR,
    timeout_s: TimeoutS = DEFAULT_TIMEOUT_S,
    as_json: Json = False,
) -> None:
    """Move this namespace's scheduled jobs (of paused queues) and its schedules into namespace
    TO, keeping their ids; run it again until it leaves nothing (docs/operations.md)."""
    if (refusal := namespace_refusal(to)) is not None:
        raise typer.BadParameter(refusal, param_hint="--to")
    options = ReplicaOptions(data_dir=data_dir, timeout_s=timeout_s, quiet=as_json)

    async def main() -> ExitCode:
        settings = Settings.from_env()
        if to == settings.namespace:
            raise OperatorError(ExitCode.USAGE, f"--to {to!r} is this namespace already")
        old, new = Topics(settings.namespace), Topics(to)
        async with replica(options) as local:
            plan = read_plan(local, to)
        if not dry_run and (plan.jobs or plan.schedules):
            await _write(settings, plan, old, new, partitions)
        report(summary(plan, old=old.namespace, new=to, written=not dry_run), as_json)
        return ExitCode.OK

    run(main)


async def _write(
    settings: Settings, plan: migration.Plan, old: Topics, new: Topics, partitions: int | None
) -> None:
    await ensure_topics(
        settings.bootstrap,
        new.namespace,
        event_partitions=partitions or await _events_partitions(settings, new),
        queues=queues_of(plan),
        dispatch_partitions=settings.dispatch_partitions,
        replication_factor=settings.replication_factor,
        **dict(settings.kafka_options),
    )
    groups: Sequence[Sequence[Outgoing]] = pairs(plan, old, new)
    await write_atomically(
        settings, groups, transactional_id=f"{old.namespace}.migrate.{new.namespace}"
    )


async def _events_partitions(settings: Settings, new: Topics) -> int:
    """The new namespace's events partitions: its topic's if it exists (an earlier run made it),
    else ``EVSCHED_EVENT_PARTITIONS``."""
    options = dict(settings.kafka_options)
    try:
        return await partition_count(settings.bootstrap, new.events, **options)
    except (KafkaError, TopicProvisioningError):
        return settings.event_partitions


def report(document: dict[str, object], as_json: bool) -> None:
    if as_json:
        emit_json(document)
        return
    verb = "moved" if document["written"] else "would move"
    out.print(
        f"{verb} {document['jobs']} jobs and {document['schedules']} schedules from "
        f"{document['from']} to {document['to']}"
    )
    left = document["left"]
    assert isinstance(left, dict)
    if left:
        counts = ", ".join(f"{n} {status}" for status, n in left.items())
        out.print(
            f"left in {document['from']}: {counts} (pause their queues, let running jobs "
            "finish, then run it again)"
        )
