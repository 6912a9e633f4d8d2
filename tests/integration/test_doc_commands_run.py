"""Every ``evsched`` command that README.md and docs/ show, run on a real stack (a broker, a
node, a worker): a false command in the docs fails here, not in a reader's shell.

The commands are read as ``tests/documented_commands.py`` reads them. Each one runs once, in
document order (lines that differ only in how they spell a placeholder or in their comment run
once), through Typer's runner in this process, in a fresh working directory of its own. It runs
for real and must exit 0, or the code ``EXIT_CODES`` gives, unless:

- ``HELP_ONLY`` names its command (it serves until stopped, or acts beyond the test's
  namespace): then ``--help`` must exit 0; a line with ``--dry-run`` writes nothing and runs;
- ``RUN_WITH`` adds options to it (``archive --once``: it follows the log until stopped);
- it is prose naming a command rather than one to type (``evsched audit``:
  ``documented_commands.names_a_command``), which the unit test checks against ``--help``.

So a new command runs for real. Placeholders (``<job-id>``, ``3f2c…``, ``Q``, ``N``, ``DIR``,
...) become things of the test's namespace (``World.value``): a job in the state the command
needs (a fresh one when the command changes it), a declared queue, the node's data dir. Before a
command, ``World.prepare`` writes what it presumes (the schedule it names exists, the queue it
resumes is paused), so each line holds on its own, in whatever order the docs show them.
Absolute paths (``/srv/evsched-archive``) move under the test's tmp dir, shared by every
command; ``replay/`` is a copy of the repository's corpus (``--update-expected`` writes there).
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import sys
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import pytest_asyncio
from tests.conftest import unique_name
from tests.documented_commands import (
    ROOT,
    Documented,
    command_path,
    documented,
    help_of,
    names_a_command,
    words,
)
from tests.integration.engine import Stack
from tests.integration.stacks import node_and_worker
from typer.testing import CliRunner

from evsched.adapters.kafka.topics import ensure_topics
from evsched.cli import app as evsched
from evsched.client import App, chain
from evsched.core.state import Status

pytestmark = [pytest.mark.broker, pytest.mark.slow, pytest.mark.timeout(600)]

# Run with --help only, and why.
HELP_ONLY: dict[tuple[str, ...], str] = {
    ("dev",): "starts a broker, a node, a worker and the API, and serves until stopped",
    ("node",): "serves until stopped (the stack's own node is this command)",
    ("worker",): "serves until stopped (the stack's own worker is this command)",
    ("api",): "serves until stopped (tests/integration/test_api.py starts it)",
    ("kafka", "up"): "starts brokers that outlive the command (conftest starts the session's)",
    ("kafka", "down"): "stops the brokers of the default data dir, which may be a developer's",
    ("namespace", "migrate"): "moves the namespace's schedules away from under the other "
    "commands (test_namespace_migrate.py runs it; with --dry-run it runs here)",
    ("relay",): "serves until stopped, and needs PostgreSQL (test_outbox.py runs it)",
    ("outbox", "init"): "needs PostgreSQL (test_outbox_cli.py runs it on the test server)",
    ("outbox", "status"): "needs PostgreSQL (test_outbox_cli.py runs it on the test server)",
}
# Options added to a command that would otherwise run until stopped, and why.
RUN_WITH: dict[tuple[str, ...], tuple[str, ...]] = {
    ("archive",): ("--once",),  # it follows the log for ever; --once stops at the log end
    # Two processes are two interpreters spawned, seconds each here; the fold is the same
    # (test_operator_cli.py rebuilds with --processes 2).
    ("rebuild",): ("--processes", "1"),
}
# Run in a process of their own, and why.
OWN_PROCESS: dict[tuple[str, ...], str] = {
    ("archive",): "it points the process's logging at the stderr of the moment, which Typer's "
    "runner closes after it (a later command's log line would fail on it)",
}
# Exit codes other than 0 that the docs give for what the test runs.
EXIT_CODES: dict[tuple[str, ...], int] = {
    ("kafka", "status"): 3,  # "exits 3 unless all are up": no broker runs in its data dir
}
JOB_IDS = {"<job-id>", "<job>", "ID", "JOB", "3f2c…", "9ab1…"}
QUEUES = {"Q", "QUEUE", "NAME"}
SCHEDULE_IDS = {"SCHEDULE_ID"}
PARTITIONS = 3
runner = CliRunner()


@dataclass(frozen=True, slots=True)
class Step:
    """One distinct documented line: where it is shown, its command path and its words."""

    doc: Documented
    path: tuple[str, ...]
    tokens: list[str]

    @property
    def how(self) -> str:
        if names_a_command(self.doc, self.path, self.tokens):
            return "named"
        if self.path in HELP_ONLY and "--dry-run" not in self.tokens:
            return "help"
        return "run"


def steps() -> list[Step]:
    """The documented lines, one per shape: ``audit <job-id>``, ``audit JOB`` and ``audit
    3f2c…  # one job`` are one command."""
    seen: set[tuple[str, ...]] = set()
    found = []
    for doc in documented():
        tokens = words(doc.line)
        if (key := shape(tokens)) not in seen:
            seen.add(key)
            found.append(Step(doc, command_path(tokens), tokens))
    return found


def shape(tokens: list[str]) -> tuple[str, ...]:
    """The words with job ids, queue names and live dirs as what they stand for."""
    found, previous = [], ""
    for token in tokens:
        if previous == "--live-dir":
            found.append("<live>")
        else:
            found.append("<job>" if token in JOB_IDS else "<queue>" if token in QUEUES else token)
        previous = token
    return tuple(found)


def job_kind(path: tuple[str, ...], tokens: list[str]) -> str:
    """What a job id of this command must be; kinds but ``done`` and ``workflow`` are fresh
    jobs, one per id, as the command changes them."""
    if path == ("cancel",):
        return "waiting"
    if path == ("requeue",):
        return "rerun" if "--rerun" in tokens else "dead"
    if path == ("dlq", "requeue"):
        return "dead"
    if path == ("workflow", "cancel"):
        return "workflow-waiting"
    if path == ("workflow", "requeue"):
        return "workflow-failed"
    return "workflow" if path[0] == "workflow" else "done"


class World:
    """The test's namespace as the documented commands find it: jobs, queues, schedules."""

    def __init__(self, stack: Stack, client: App, tmp: Path) -> None:
        self.stack, self.client, self.tmp = stack, client, tmp
        self.jobs: dict[str, list[str]] = {}
        self.archive = tmp / "root" / "srv" / "evsched-archive"
        self.corpus = tmp / "replay"
        shutil.copytree(ROOT / "replay", self.corpus)
        self.env = {
            "EVSCHED_KAFKA_BOOTSTRAP": stack.bootstrap,
            "EVSCHED_NAMESPACE": stack.namespace,
            "EVSCHED_EVENT_PARTITIONS": str(PARTITIONS),
            # An operator holds the node keys, to judge proofs as the nodes do (docs/security.md).
            "EVSCHED_NODE_KEY": stack.node_key,
            "EVSCHED_REPLICA_DATA_DIR": str(tmp / "cli-replica"),  # the stack has tmp/replica
            "EVSCHED_KAFKA_DATA": str(tmp / "no-broker"),
            "COLUMNS": "200",
        }

    async def stock(self, runs: list[Step]) -> None:
        """The jobs the commands name, each kind in the state its commands need."""
        needed = Counter({"done": 1, "workflow": 1})
        for step in runs:
            kind = job_kind(step.path, step.tokens)
            if kind not in {"done", "workflow"}:
                needed[kind] += sum(t in JOB_IDS for t in step.tokens)
        waits: list[tuple[str, Status]] = []
        for kind, count in needed.items():
            for i in range(count):
                job, wait = await self.make(kind, i)
                self.jobs.setdefault(kind, []).append(job)
                waits += wait
        for job, status in waits:
            await self.stack.wait_status(job, status)

    async def make(self, kind: str, number: int) -> tuple[str, list[tuple[str, Status]]]:
        """A job of ``kind`` enqueued: its id, and the (job, status) that make it ready."""
        noop, effect = self.client.get_task("s.noop"), self.client.get_task("s.effect")
        dies = self.client.get_task("s.permanent")
        if kind in {"done", "rerun"}:
            job = (await effect.enqueue(f"{kind}-{number}")).job_id
            return job, [(job, Status.SUCCEEDED)]
        if kind == "dead":
            job = (await dies.enqueue()).job_id
            return job, [(job, Status.DEAD)]
        if kind == "waiting":
            return (await noop.options(delay=3600).enqueue()).job_id, []
        if kind == "workflow-waiting":
            flow = chain(noop.options(delay=3600).s(), effect.s())
            return (await self.client.enqueue_workflow(flow)).job_ids[0], []
        # A chain whose first job died, and whose second was cancelled for it.
        job, child = (await self.client.enqueue_workflow(chain(dies.s(), effect.s()))).job_ids
        return job, [(child, Status.CANCELLED)]

    def job(self, kind: str) -> str:
        shared = kind in {"done", "workflow"}
        return self.jobs[kind][0] if shared else self.jobs[kind].pop()

    def value(self, step: Step, previous: str, token: str) -> str:
        """What ``token`` (after ``previous``) stands for in this test's namespace."""
        named = {
            "--live-dir": str(self.stack.node_data("node-1")),
            "--count": "6",
            "--partitions": str(PARTITIONS),
            "--dispatch-partitions": str(PARTITIONS),
            "--bootstrap": self.stack.bootstrap,
            "--namespace": self.stack.namespace,
            "--partition": "0" if token == "P" else token,
            "--from": {"OFFSET": "0", "START": "2026-11-01T00:00Z"}.get(token, token),
            "--to": {"DIR": str(self.archive), "END": "2026-11-02T00:00Z"}.get(token, token),
            "--archive": str(self.archive) if token == "DIR" else token,
        }
        placeholder = token.isupper() or token.startswith("<")
        if previous in named and (placeholder or previous == "--live-dir"):
            return named[previous]
        if token in SCHEDULE_IDS or (step.path[0] == "schedules" and token in JOB_IDS):
            return "nightly"
        if token in JOB_IDS:
            return self.job(job_kind(step.path, step.tokens))
        if token in QUEUES:  # a queue of its own where the command changes its topics
            topics = step.path in {("kafka", "topics"), ("queues", "partitions")}
            return unique_name("q") if topics else "default"
        return self.path(token)

    def path(self, token: str) -> str:
        """``replay/...`` in the corpus' copy, an absolute path under the tmp dir."""
        if token.startswith("replay/"):
            return str(self.corpus / token.removeprefix("replay/"))
        return str(self.tmp / "root" / token.lstrip("/")) if token.startswith("/") else token

    async def prepare(self, path: tuple[str, ...], args: list[str], cwd: Path) -> None:
        """Write what the command presumes; the command's own writes land after these."""
        target = next((a for a in args[len(path) :] if not a.startswith("-")), "")
        if path == ("queues", "partitions"):
            await ensure_topics(
                self.stack.bootstrap,
                self.stack.namespace,
                event_partitions=PARTITIONS,
                queues=[target],
            )
        elif path == ("queues", "pause"):
            await self.client.resume_queue(target)
        elif path == ("queues", "resume"):
            await self.client.pause_queue(target)
        elif path[0] == "schedules" and path[1:] not in {("list",), ("upsert",)}:
            await self.schedule(target, paused=path[1:] == ("resume",))
        elif path == ("audit",) and target == "nightly":
            await self.schedule(target, paused=False)
        if "--archive" in args and not self.archive.exists():
            archived = await self.spawn(["archive", "--to", str(self.archive), "--once"], cwd)
            assert not archived, archived
        if path == ("replay",) and "--expected" in args and "--update-expected" not in args:
            updated = await self.invoke([*args, "--update-expected"], expect=0, cwd=cwd)
            assert not updated, updated

    async def schedule(self, schedule_id: str, *, paused: bool) -> None:
        """The schedule exists, paused or not (a pause of a paused one is refused, harmlessly)."""
        await self.client.upsert_schedule(schedule_id, "0 3 * * *", "UTC", "s.noop")
        if paused:
            await self.client.pause_schedule(schedule_id)
        else:
            await self.client.resume_schedule(schedule_id)

    async def invoke(self, args: list[str], *, expect: int, cwd: Path) -> str:
        """Run ``evsched args`` in ``cwd``, in this process; '' when it exits ``expect``, else
        what it printed."""

        def run() -> tuple[int, str]:
            with contextlib.chdir(cwd):
                result = runner.invoke(evsched, args, env=self.env, prog_name="evsched")
            return result.exit_code, result.output + repr(result.exception or "")

        code, output = await asyncio.to_thread(run)
        return "" if code == expect else f"exit {code}, not {expect}:\n{output[-3000:]}"

    async def spawn(self, args: list[str], cwd: Path, expect: int = 0) -> str:
        """``invoke``, in a process of its own (``python -m evsched``, this checkout's code)."""
        process = await asyncio.create_subprocess_exec(
            *[sys.executable, "-m", "evsched", *args],
            cwd=cwd,
            env={**self.stack.env(), **self.env},
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        output, _ = await process.communicate()
        code = process.returncode
        return "" if code == expect else f"exit {code}, not {expect}:\n{output.decode()[-3000:]}"


async def outcome(world: World, step: Step, number: int) -> str:
    """'' when the step's line holds, else why not."""
    if step.how == "help":
        code, output = help_of(step.path)
        return "" if code == 0 else f"--help exit {code}:\n{output}"
    args, previous = [], ""
    for token in step.tokens:
        args.append(world.value(step, previous, token))
        previous = token
    cwd = world.tmp / "steps" / f"{number:03d}"
    cwd.mkdir(parents=True)
    await world.prepare(step.path, args, cwd)
    args += RUN_WITH.get(step.path, ())
    expect = EXIT_CODES.get(step.path, 0)
    if step.path in OWN_PROCESS:
        failed = await world.spawn(args, cwd, expect)
    else:
        failed = await world.invoke(args, expect=expect, cwd=cwd)
    return failed and f"evsched {' '.join(args)}: {failed}"


@pytest_asyncio.fixture
async def world(kafka_bootstrap: str, tmp_path: Path) -> AsyncIterator[World]:
    async with node_and_worker(kafka_bootstrap, "doc", tmp_path) as stack:
        await ensure_topics(
            kafka_bootstrap, stack.namespace, event_partitions=PARTITIONS, queues=["billing"]
        )
        async with stack.app() as client:
            yield World(stack, client, tmp_path)


async def test_every_documented_command_runs(world: World) -> None:
    plan = [step for step in steps() if step.how != "named"]
    hows = Counter(step.how for step in plan)
    assert hows["run"] >= 60 and hows["help"] >= 8, hows  # the docs were read, not skipped
    await world.stock([step for step in plan if step.how == "run"])
    false = []
    for number, step in enumerate(plan):
        if failed := await outcome(world, step, number):
            false.append(f"{step.doc.where}: `{step.doc.line}`: {failed}")
    assert not false, "\n\n".join(false)
