"""``evsched queues partitions NAME --count N``: add partitions to a live queue's dispatch topic.

Nodes and workers keep running: nodes spread dispatch records over the new partitions once their
producers' metadata shows them, and the queue's worker pools rebalance onto them, reading each
new partition from its first record, so nothing written there before a pool noticed it is lost.
"""

from __future__ import annotations

from typing import Annotated

import typer

from evsched.adapters.kafka.topic_growth import ShrinkRefused, grow_partitions
from evsched.adapters.kafka.topics import TopicMissing, Topics
from evsched.core.bounds import queue_refusal
from evsched.operator.cmd_controls import QueueName
from evsched.operator.exits import ExitCode, OperatorError
from evsched.operator.render import emit_json, out
from evsched.operator.session import Json, run
from evsched.settings import Settings

Count = Annotated[
    int,
    typer.Option(
        "--count",
        min=1,
        max=10_000,
        help="The partitions the queue's dispatch topic has afterwards (never fewer than now).",
    ),
]


def queues_partitions(*, queue: QueueName, count: Count, as_json: Json = False) -> None:
    """Grow a queue's dispatch topic to COUNT partitions while nodes and workers run, so more
    workers of a pool take its jobs at once. Kafka cannot remove partitions: fewer is refused."""
    if (refusal := queue_refusal(queue)) is not None:
        raise typer.BadParameter(refusal, param_hint="NAME")

    async def main() -> ExitCode:
        settings = Settings.from_env()
        topic = Topics(settings.namespace).dispatch(queue)
        try:
            growth = await grow_partitions(settings, topic, count)
        except TopicMissing:
            raise OperatorError(
                ExitCode.NOT_FOUND,
                f"queue {queue!r} is not declared ({topic} does not exist): create it with "
                f"`evsched kafka topics --queue {queue}`",
            ) from None
        except ShrinkRefused as exc:
            raise OperatorError(ExitCode.USAGE, str(exc)) from None
        if as_json:
            emit_json({"topic": growth.topic, "before": growth.before, "after": growth.after})
        elif growth.after == growth.before:
            out.print(f"{topic} already has {growth.after} partitions")
        else:
            out.print(f"{topic}: {growth.before} -> {growth.after} partitions")
        return ExitCode.OK

    run(main)
