"""The operator's commands, one module per CLI noun; ``register`` adds them to ``evsched``."""

from __future__ import annotations

import typer

# Modules only: the commands' names (export, rebuild, replay, ...) are also their modules' names.
from evsched.operator.commands import (
    archive,
    dlq,
    export,
    jobs,
    namespace,
    outbox,
    queues,
    rebuild,
    replay,
    schedules,
    undecodable,
    workflow,
)

EXIT_CODES_HELP = (
    "Exit codes: 0 ok; 1 a check failed (replay diverged, rebuild digests differ); 2 bad "
    "arguments; 3 not found; 4 Kafka or the index unavailable; 5 a write the fold refused; "
    "70 an internal error (EVSCHED_DEBUG=1 shows its traceback); 130 interrupted."
)


def register(app: typer.Typer) -> None:
    """Add the operator commands to ``app`` (the ``evsched`` command line)."""
    for name, command in (
        ("enqueue", jobs.enqueue),
        ("job", jobs.job_command),
        ("jobs", jobs.jobs),
        ("audit", jobs.audit_command),
        ("cancel", jobs.cancel),
        ("requeue", jobs.requeue),
        ("export", export.export),
        ("archive", archive.archive),
        ("rebuild", rebuild.rebuild),
        ("replay", replay.replay),
        ("undecodable", undecodable.undecodable),
    ):
        app.command(name, epilog=EXIT_CODES_HELP)(command)
    app.add_typer(dlq.dlq_app(), name="dlq", epilog=EXIT_CODES_HELP)
    app.add_typer(schedules.schedules_app(), name="schedules", epilog=EXIT_CODES_HELP)
    app.add_typer(queues.queues_app(), name="queues", epilog=EXIT_CODES_HELP)
    app.add_typer(workflow.workflow_app(), name="workflow", epilog=EXIT_CODES_HELP)
    app.add_typer(namespace.namespace_app(), name="namespace", epilog=EXIT_CODES_HELP)
    app.add_typer(outbox.outbox_app(), name="outbox", epilog=EXIT_CODES_HELP)


__all__ = ["EXIT_CODES_HELP", "register"]
