"""The operator commands without a broker: bad arguments name the parameter and exit 2; offline
reads answer from a local index; replays exit 0 when identical and 1 when diverged."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from evsched.adapters.archive.history_file import LoggedEvent, write_history
from evsched.core import events as ev
from evsched.operator.replay import dump_expected, expected_document, fold_history
from tests.unit.operator.test_operator_audit import Story, zombie_story

runner = CliRunner()


@pytest.fixture
def data_dir(tmp_path: Path) -> Iterator[Path]:
    """A one-partition replica holding the zombie story's job."""
    index = zombie_story().index(tmp_path / "replica" / "p0000")
    index.close()
    yield tmp_path / "replica"


def invoke(cli: typer.Typer, *args: str) -> tuple[int, str]:
    """Exit code and output, with rich's boxes and line wrapping taken out."""
    result = runner.invoke(cli, list(args))
    text = result.output
    if result.exit_code == 2:
        text = " ".join(text.replace("│", " ").split())
    return result.exit_code, text


@pytest.mark.parametrize(
    ("args", "parameter", "words"),
    [
        (["enqueue", "t", "{not json"], "ARGS_JSON", "not JSON"),
        (["enqueue", "t", '{"a": 1}'], "ARGS_JSON", "JSON array"),
        (["enqueue", "t", "--kwargs", "[1]"], "--kwargs", "JSON object"),
        (["enqueue", "t", "--run-at", "2030-01-01T00:00:00"], "--run-at", "no time zone"),
        (["enqueue", "t", "--run-at", "tomorrow"], "--run-at", "not an ISO 8601 time"),
        (
            ["enqueue", "t", "--run-at", "2030-01-01T00:00:00Z", "--delay-s", "5"],
            "--run-at",
            "not both",
        ),
        (["enqueue", "t", "--queue", "no spaces"], "--queue", "Kafka topic name"),
        (["enqueue", "t", "--idempotency-key", ""], "--idempotency-key", "non-empty"),
        (["requeue", "j", "--run-at", "1999-01-01T00:00:00Z"], "--run-at", "in the past"),
        (["schedules", "upsert", "s", "not cron", "t"], "CRON", ""),
        (
            ["schedules", "upsert", "s", "* * * * *", "t", "--timezone", "Mars/Base"],
            "--timezone",
            "",
        ),
        (["export", "-o", "x", "--job", "j", "--partition", "1"], "--job", "takes no --partition"),
        (["export", "-o", "x", "--from", "3"], "--from/--to", "add --partition"),
        (["export", "-o", "x", "--partition", "0", "--from", "9", "--to", "3"], "--to", "before"),
        (["dlq", "requeue"], "--all", "give job ids or --all"),
        (["dlq", "requeue", "j", "--all"], "--all", "not both"),
        (["rebuild", "--verify"], "--verify", "--live-dir"),
    ],
)
def test_bad_arguments_name_the_parameter_and_exit_2(
    cli: typer.Typer, args: list[str], parameter: str, words: str
) -> None:
    code, output = invoke(cli, *args)
    assert code == 2, output
    assert parameter in output and words in output


def test_audit_offline_shows_every_event_with_its_reading(cli: typer.Typer, data_dir: Path) -> None:
    code, output = invoke(cli, "audit", "job", "--offline", "--data-dir", str(data_dir))
    assert code == 0, output
    assert "AttemptSucceeded" in output and "succeeded" in output

    code, output = invoke(cli, "audit", "job", "--offline", "--data-dir", str(data_dir), "--json")
    document = json.loads(output)
    assert code == 0
    assert [e["verdict"] for e in document["events"]].count("stale") == 1
    stale = next(e for e in document["events"] if e["verdict"] == "stale")
    assert stale["reading"] == "completion from worker-3 rejected: token 2 is stale, current is 3"
    assert document["state"]["status"] == "succeeded" and document["drifted_offsets"] == []


def test_audit_as_of_shows_the_state_then(cli: typer.Typer, data_dir: Path) -> None:
    args = ["audit", "job", "--offline", "--data-dir", str(data_dir), "--as-of", "4", "--json"]
    code, output = invoke(cli, *args)
    document = json.loads(output)
    assert code == 0
    assert [e["offset"] for e in document["events"]] == [0, 1, 2, 3, 4]
    assert (document["state"]["status"], document["state"]["token"]) == ("running", 2)


def test_reads_of_unknown_things_exit_3(cli: typer.Typer, data_dir: Path, tmp_path: Path) -> None:
    assert invoke(cli, "job", "nope", "--offline", "--data-dir", str(data_dir))[0] == 3
    assert invoke(cli, "audit", "nope", "--offline", "--data-dir", str(data_dir))[0] == 3
    assert invoke(cli, "jobs", "--offline", "--data-dir", str(tmp_path / "empty"))[0] == 3


def test_job_and_jobs_offline(cli: typer.Typer, data_dir: Path) -> None:
    code, output = invoke(cli, "job", "job", "--offline", "--data-dir", str(data_dir), "--json")
    assert code == 0 and json.loads(output)["token"] == 3
    args = ["jobs", "--status", "succeeded", "--offline", "--data-dir", str(data_dir), "--json"]
    code, output = invoke(cli, *args)
    assert code == 0 and [j["job_id"] for j in json.loads(output)] == ["job"]
    code, output = invoke(cli, "dlq", "list", "--offline", "--data-dir", str(data_dir))
    assert code == 0 and "no matching jobs" in output


def test_export_of_one_job_from_the_index_is_reproducible(
    cli: typer.Typer, data_dir: Path, tmp_path: Path
) -> None:
    paths = [tmp_path / "one.avro", tmp_path / "two.avro"]
    for path in paths:
        args = ["export", "--job", "job", "-o", str(path), "--offline", "--data-dir", str(data_dir)]
        code, output = invoke(cli, *args)
        assert code == 0, output
        assert "exported 11 events" in output
    assert paths[0].read_bytes() == paths[1].read_bytes()
    assert not list(tmp_path.glob(".*.partial"))


def test_replay_exits_0_when_identical_and_1_when_diverged(
    cli: typer.Typer, tmp_path: Path
) -> None:
    events = [LoggedEvent.from_record(r) for r in zombie_story().records]
    history = tmp_path / "z.history.avro"
    with history.open("wb") as out:
        write_history(out, events, metadata={"corpus": "z"})
    document = expected_document(fold_history(events), history=history.name, description="z")
    expected = tmp_path / "z.expected.json"
    expected.write_text(dump_expected(document))

    assert invoke(cli, "replay", str(history))[0] == 0
    assert invoke(cli, "replay", str(tmp_path))[0] == 0  # a folder: every history in it

    document["jobs"]["job"]["events"][8][3] = "applied"  # as if the zombie had been accepted
    expected.write_text(dump_expected(document))
    code, output = invoke(cli, "replay", str(history))
    assert code == 1
    assert (
        "first divergence: job at p0@8 (AttemptSucceeded): verdict expected 'applied', got 'stale'"
        in (output.replace("\n", ""))
    )
    code, output = invoke(cli, "replay", str(history), "--json")
    assert code == 1 and json.loads(output)[0]["first_divergence"]["field"] == "verdict"

    assert invoke(cli, "replay", str(history), "--update-expected")[0] == 0
    assert invoke(cli, "replay", str(history))[0] == 0
    assert invoke(cli, "replay", str(tmp_path / "missing.history.avro"))[0] == 3


def test_the_evsched_command_line_has_the_operator_commands() -> None:
    from evsched.cli import app

    result = runner.invoke(app, ["--help"], env={"COLUMNS": "200"})
    names = {"enqueue", "job", "jobs", "audit", "cancel", "requeue", "export", "rebuild", "replay"}
    assert result.exit_code == 0
    assert all(f" {name} " in result.output for name in names | {"dlq", "schedules"})
    code, output = invoke(app, "replay", "--help")
    assert code == 0 and "Exit codes: 0 ok; 1 a check failed" in " ".join(output.split())


def test_schedules_show_offline_reads_one_schedule_and_its_pause(
    cli: typer.Typer, tmp_path: Path
) -> None:
    story = Story()
    template = ev.JobTemplate(task="report", queue="default", args=b'["[b]x[/b]"]')
    story.add(
        ev.ScheduleUpserted(
            event_id="u1",
            schedule_id="nightly",
            emitted_at=0,
            source="client",
            cron="0 3 * * *",
            timezone="Europe/Paris",
            template=template,
            overlap="skip",
        )
    )
    paused = ev.SchedulePaused(
        event_id="p1", schedule_id="nightly", emitted_at=0, source="operator", reason="audit week"
    )
    story.add(paused)
    story.index(tmp_path / "replica" / "p0000").close()
    where = ["--offline", "--data-dir", str(tmp_path / "replica")]

    code, output = invoke(cli, "schedules", "show", "nightly", *where, "--json")
    shown = json.loads(output)
    assert code == 0 and shown["paused"] is True
    assert (shown["cron"], shown["timezone"], shown["overlap"]) == (
        "0 3 * * *",
        "Europe/Paris",
        "skip",
    )
    assert shown["template"]["task"] == "report"

    code, output = invoke(cli, "schedules", "show", "nightly", *where)
    assert code == 0
    assert "report on queue default" in output and "audit week" in output
    assert "[b]x[/b]" in output  # the args are printed as data, not read as markup

    assert invoke(cli, "schedules", "show", "nope", *where)[0] == 3
