"""The operator's command line: reads from a caught-up local replica, writes, audits, exports,
rebuilds and replays; ``register`` adds its commands to the ``evsched`` app."""

from __future__ import annotations

import typer

# Modules only: the commands' names (export, rebuild, replay) are also names of submodules.
from evsched.operator import (
    cmd_archive,
    cmd_backfill,
    cmd_controls,
    cmd_export,
    cmd_limits,
    cmd_namespace,
    cmd_partitions,
    cmd_read,
    cmd_rebuild,
    cmd_replay,
    cmd_undecodable,
    cmd_workflow,
    cmd_write,
)

EXIT_CODES_HELP = (
    "Exit codes: 0 ok; 1 a check failed (replay diverged, rebuild digests differ); 2 bad "
    "arguments; 3 not found; 4 Kafka or the index unavailable; 5 a write the fold refused; "
    "70 an internal error (EVSCHED_DEBUG=1 shows its traceback); 130 interrupted."
)


def dlq_app() -> typer.Typer:
    dlq = typer.Typer(no_args_is_help=True, help="The dead-letter queue: dead jobs.")
    dlq.command("list")(cmd_read.dlq_list)
    dlq.command("requeue")(cmd_write.dlq_requeue)
    return dlq


def schedules_app() -> typer.Typer:
    schedules = typer.Typer(no_args_is_help=True, help="Cron schedules.")
    schedules.command("list")(cmd_read.schedules_list)
    schedules.command("upsert")(cmd_write.schedules_upsert)
    schedules.command("delete")(cmd_write.schedules_delete)
    schedules.command("pause")(cmd_controls.schedules_pause)
    schedules.command("resume")(cmd_controls.schedules_resume)
    schedules.command("backfill")(cmd_backfill.schedules_backfill)
    return schedules


def queues_app() -> typer.Typer:
    queues = typer.Typer(
        no_args_is_help=True,
        help="Queues: pause, resume, concurrency limits and dispatch partitions.",
    )
    queues.command("pause")(cmd_controls.queues_pause)
    queues.command("resume")(cmd_controls.queues_resume)
    queues.command("show")(cmd_controls.queues_show)
    queues.command("limit")(cmd_limits.queues_limit)
    queues.command("partitions")(cmd_partitions.queues_partitions)
    return queues


def namespace_app() -> typer.Typer:
    namespace = typer.Typer(no_args_is_help=True, help="The namespace: move it into a new one.")
    namespace.command("migrate")(cmd_namespace.namespace_migrate)
    return namespace


def register(app: typer.Typer) -> None:
    """Add the operator commands to ``app`` (the ``evsched`` command line)."""
    for name, command in (
        ("enqueue", cmd_write.enqueue),
        ("job", cmd_read.job_command),
        ("jobs", cmd_read.jobs),
        ("audit", cmd_read.audit_command),
        ("cancel", cmd_write.cancel),
        ("requeue", cmd_write.requeue),
        ("export", cmd_export.export),
        ("archive", cmd_archive.archive),
        ("rebuild", cmd_rebuild.rebuild),
        ("replay", cmd_replay.replay),
        ("undecodable", cmd_undecodable.undecodable),
    ):
        app.command(name, epilog=EXIT_CODES_HELP)(command)
    app.add_typer(dlq_app(), name="dlq", epilog=EXIT_CODES_HELP)
    app.add_typer(schedules_app(), name="schedules", epilog=EXIT_CODES_HELP)
    app.add_typer(queues_app(), name="queues", epilog=EXIT_CODES_HELP)
    app.add_typer(cmd_workflow.workflow_app(), name="workflow", epilog=EXIT_CODES_HELP)
    app.add_typer(namespace_app(), name="namespace", epilog=EXIT_CODES_HELP)


__all__ = ["EXIT_CODES_HELP", "register"]
