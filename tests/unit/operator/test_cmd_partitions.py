"""``evsched queues partitions`` and ``evsched namespace migrate``: arguments checked before
Kafka is asked, a bad one saying what is wrong; and the migration's report."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from evsched.cli import app
from evsched.core import migration
from evsched.core.state import Status
from evsched.operator.commands.namespace import queues_of, report, summary
from tests.states import job_state

NOWHERE = {"EVSCHED_KAFKA_BOOTSTRAP": "127.0.0.1:1", "EVSCHED_NAMESPACE": "old"}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["queues", "partitions", "bad queue!", "--count", "3"], "must be non-empty and only"),
        (["queues", "partitions", "q", "--count", "0"], "greater than or equal to 1"),
        (["queues", "partitions", "q"], "Missing option '--count'"),
        (["namespace", "migrate", "--to", "no way!"], "--to"),
        (["namespace", "migrate", "--to", "old"], "is this namespace already"),
    ],
)
def test_bad_arguments_are_refused_before_kafka_is_asked(args: list[str], message: str) -> None:
    result = CliRunner().invoke(app, args, env=NOWHERE)
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split())


def test_the_report_says_what_moved_and_what_was_left(capsys: pytest.CaptureFixture[str]) -> None:
    plan = migration.plan(
        [job_state("a", queue="mail"), job_state("b", status=Status.RUNNING)],
        [],
        paused={(0, "mail")},
        to_namespace="new",
        now_ms=1,
    )
    assert queues_of(plan) == ["mail"]
    document = summary(plan, old="old", new="new", written=True)
    assert document == {
        "from": "old",
        "to": "new",
        "written": True,
        "jobs": 1,
        "schedules": 0,
        "left": {"running": 1},
    }
    report(document, as_json=False)
    text = " ".join(capsys.readouterr().out.split())
    assert "moved 1 jobs and 0 schedules from old to new" in text
    assert "left in old: 1 running" in text
    report(summary(plan, old="old", new="new", written=False) | {"left": {}}, as_json=False)
    assert "would move 1 jobs" in capsys.readouterr().out
