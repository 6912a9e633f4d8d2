"""Every ``--json`` command of ``evsched`` prints one JSON document on stdout and logs on stderr,
so ``evsched jobs --json | jq`` works whatever the command logs. The commands are found by walking
the Typer app; each runs through ``evsched.cli.main`` in one child process (this test process's
logging stays as pytest set it up), with a log line of its own at the start of its callback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import typer

from evsched.adapters.archive.history_file import LoggedEvent, write_history
from evsched.cli import app
from evsched.core import events as ev
from evsched.operator.replay import dump_expected, expected_document, fold_history
from tests.unit.operator.test_operator_audit import zombie_story

# How each --json command runs without a broker: its arguments ({replica}, {history}, {out} and
# {kafka} are paths in the test's directory) and its exit code.
OFFLINE: dict[tuple[str, ...], tuple[list[str], int]] = {
    ("job",): (["job", "--offline", "--data-dir", "{replica}"], 0),
    ("jobs",): (["--offline", "--data-dir", "{replica}"], 0),
    ("audit",): (["job", "--offline", "--data-dir", "{replica}"], 0),
    ("undecodable",): (["--offline", "--data-dir", "{replica}"], 0),
    ("dlq", "list"): (["--offline", "--data-dir", "{replica}"], 0),
    ("schedules", "list"): (["--offline", "--data-dir", "{replica}"], 0),
    ("schedules", "show"): (["nightly", "--offline", "--data-dir", "{replica}"], 0),
    ("workflow", "show"): (["job", "--offline", "--data-dir", "{replica}"], 0),
    ("export",): (["--job", "job", "-o", "{out}", "--offline", "--data-dir", "{replica}"], 0),
    ("replay",): (["{history}"], 0),
    ("kafka", "status"): (["--data-dir", "{kafka}"], 3),  # no broker runs there: exit 3
}
# These need a broker (writes, catch-ups without --offline) or start one: their callback is
# replaced by the log line alone, which shows where their logging goes; the arguments only parse.
NEEDS_BROKER: dict[tuple[str, ...], list[str]] = {
    ("enqueue",): ["t"],
    ("cancel",): ["job"],
    ("requeue",): ["job"],
    ("archive",): ["--to", "{out}"],
    ("rebuild",): [],
    ("kafka", "up"): [],
    ("dlq", "requeue"): [],
    ("schedules", "upsert"): ["nightly", "0 3 * * *", "report"],
    ("schedules", "delete"): ["nightly"],
    ("schedules", "pause"): ["nightly"],
    ("schedules", "resume"): ["nightly"],
    ("schedules", "backfill"): [
        "nightly",
        "--from",
        "2026-01-01T00:00Z",
        "--to",
        "2026-01-02T00:00Z",
    ],
    ("queues", "pause"): ["q"],
    ("queues", "resume"): ["q"],
    ("queues", "show"): ["q"],
    ("queues", "limit"): ["q"],
    ("queues", "partitions"): ["q", "--count", "2"],
    ("workflow", "cancel"): ["job"],
    ("workflow", "requeue"): ["job"],
    ("namespace", "migrate"): ["--to", "other"],
    # A database, not a broker: tests/integration/test_outbox_cli.py runs it on PostgreSQL.
    ("outbox", "status"): ["--dsn", "postgresql://nobody@127.0.0.1:1/none"],
}

CHILD = textwrap.dedent(
    """
    import contextlib, io, json, sys
    import structlog, typer
    from evsched import cli

    def probed(callback, path, run):
        def call(*args, **kwargs):
            structlog.get_logger().info("json_command_probe", command=path)
            return callback(*args, **kwargs) if run else None
        return call

    root = typer.main.get_command(cli.app)
    cli.app = lambda: root.main(prog_name="evsched")  # what main() runs after configuring
    results = []
    for path, args, run in json.loads(sys.argv[1]):
        command = root
        for name in path:
            command = command.commands[name]
        callback = command.callback
        command.callback = probed(callback, " ".join(path), run)
        sys.argv = ["evsched", *path, *args, "--json"]
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                cli.main()
                code = 0
            except SystemExit as exc:
                code = exc.code
        command.callback = callback
        results.append([path, code, out.getvalue(), err.getvalue()])
    print(json.dumps(results))
    """
)


def json_commands() -> set[tuple[str, ...]]:
    """The paths of every command of the evsched app that takes ``--json``."""
    found: set[tuple[str, ...]] = set()

    def walk(command: Any, path: tuple[str, ...]) -> None:
        for name, sub in (getattr(command, "commands", None) or {}).items():
            walk(sub, (*path, name))
        if any("--json" in getattr(param, "opts", ()) for param in command.params):
            found.add(path)

    walk(typer.main.get_command(app), ())
    return found


def test_every_json_command_says_how_it_runs_offline_or_that_it_needs_a_broker() -> None:
    assert not OFFLINE.keys() & NEEDS_BROKER.keys()
    assert json_commands() == OFFLINE.keys() | NEEDS_BROKER.keys()


def _paths(tmp_path: Path) -> dict[str, str]:
    """A one-partition replica (a job, a schedule) and a replay history with its outcomes."""
    story = zombie_story()
    template = ev.JobTemplate(task="report", queue="default", args=b"[]")
    upsert = ev.ScheduleUpserted(
        event_id="u1",
        schedule_id="nightly",
        emitted_at=0,
        source="client",
        cron="0 3 * * *",
        timezone="UTC",
        template=template,
    )
    story.add(upsert)
    story.index(tmp_path / "replica" / "p0000").close()
    events = [LoggedEvent.from_record(r) for r in story.records]
    history = tmp_path / "z.history.avro"
    with history.open("wb") as out:
        write_history(out, events, metadata={"corpus": "z"})
    document = expected_document(fold_history(events), history=history.name, description="z")
    (tmp_path / "z.expected.json").write_text(dump_expected(document))
    return {
        "replica": str(tmp_path / "replica"),
        "history": str(history),
        "out": str(tmp_path / "job.avro"),
        "kafka": str(tmp_path / "kafka"),
    }


def _run_all(tmp_path: Path) -> dict[tuple[str, ...], tuple[int, str, str]]:
    paths = _paths(tmp_path)
    plan = [(path, args, True) for path, (args, _) in OFFLINE.items()]
    plan += [(path, args, False) for path, args in NEEDS_BROKER.items()]
    plan = [(path, [arg.format(**paths) for arg in args], run) for path, args, run in plan]
    # A broker nobody answers on: nothing here may reach a real one.
    env = {**os.environ, "EVSCHED_KAFKA_BOOTSTRAP": "127.0.0.1:9", "COLUMNS": "120"}
    command = [sys.executable, "-c", CHILD, json.dumps(plan)]
    done = subprocess.run(
        command, check=False, capture_output=True, text=True, timeout=90, env=env, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    return {tuple(path): (code, out, err) for path, code, out, err in json.loads(done.stdout)}


def _probe_lines(err: str) -> list[str]:
    lines = [json.loads(line) for line in err.splitlines() if line.startswith("{")]
    return [line["command"] for line in lines if line.get("event") == "json_command_probe"]


def test_json_output_is_one_document_on_stdout_and_logs_go_to_stderr(tmp_path: Path) -> None:
    results = _run_all(tmp_path)
    for path, (_, expected_code) in OFFLINE.items():
        code, out, err = results[path]
        assert code == expected_code, (path, out, err)
        json.loads(out)  # one JSON document, nothing before or after it
        assert _probe_lines(err) == [" ".join(path)], (path, err)
    for path in NEEDS_BROKER:
        code, out, err = results[path]
        assert (code, out) == (0, ""), (path, out, err)
        assert _probe_lines(err) == [" ".join(path)], (path, err)
