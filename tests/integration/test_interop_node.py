"""A producer in another language: interop/node/enqueue.mjs (kafkajs + avsc), written from
docs/wire-format.md alone, enqueues jobs that a real node and Python worker run.

Without ``node``/``npm`` these tests are skipped, except under ``CI=true``, where that is a
failure. ``npm ci`` runs once per lockfile: a stamp in ``interop/node/node_modules`` names the
lockfile's hash it installed.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import shutil
import subprocess
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from aiokafka.partitioner import murmur2
from tests.conftest import unique_name
from tests.integration.engine import REPO, Stack, effect_id, wait_for
from tests.unit.docs.test_wire_format_doc import example_event

from evsched.adapters.avro import decode_event, encode_event
from evsched.adapters.kafka.topics import ensure_topics
from evsched.core import ids
from evsched.core.events import (
    AttemptStarted,
    AttemptSucceeded,
    Event,
    JobEnqueued,
    JobLeased,
    TraceContext,
)
from evsched.core.state import Status, Verdict

PROGRAM_DIR = REPO / "interop" / "node"
PROGRAM = PROGRAM_DIR / "enqueue.mjs"
STAMP = PROGRAM_DIR / "node_modules" / ".evsched-lockfile-sha256"
NPM_TIMEOUT_S = 300
NODE_TIMEOUT_S = 60
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
TRACESTATE = "congo=t61rcWkgMzE"


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() == "true"


@pytest.fixture(scope="session")
def node_program() -> Path:
    """enqueue.mjs with its locked dependencies installed (``npm ci``, once per lockfile)."""
    missing = [tool for tool in ("node", "npm") if shutil.which(tool) is None]
    if missing:
        reason = f"{' and '.join(missing)} not on PATH"
        if _in_ci():
            pytest.fail(f"{reason} (CI=true: the Node.js interop tests must run)", pytrace=False)
        pytest.skip(reason)
    lock = hashlib.sha256((PROGRAM_DIR / "package-lock.json").read_bytes()).hexdigest()
    if not STAMP.is_file() or STAMP.read_text().strip() != lock:
        done = subprocess.run(
            ["npm", "ci", "--no-audit", "--no-fund", "--ignore-scripts"],
            cwd=PROGRAM_DIR,
            capture_output=True,
            text=True,
            timeout=NPM_TIMEOUT_S,
            check=False,
        )
        assert done.returncode == 0, f"npm ci failed:\n{done.stdout}\n{done.stderr}"
        STAMP.write_text(lock)
    return PROGRAM


@dataclass(frozen=True)
class Ran:
    code: int
    stdout: str
    stderr: str

    def landed(self) -> dict[str, Any]:
        """Where the program says the record landed (its one JSON line on stderr)."""
        (line,) = [x for x in self.stderr.splitlines() if x.startswith('{"job_id"')]
        landed: dict[str, Any] = json.loads(line)
        return landed


def node_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("EVSCHED_")}
    env.update(extra)
    return env


def run_sync(program: Path, *args: str, env: dict[str, str] | None = None) -> Ran:
    done = subprocess.run(
        ["node", str(program), *args],
        cwd=REPO,
        env=env or node_env(),
        capture_output=True,
        text=True,
        timeout=NODE_TIMEOUT_S,
        check=False,
    )
    return Ran(done.returncode, done.stdout, done.stderr)


def dry_run(program: Path, *args: str) -> tuple[dict[str, Any], bytes]:
    ran = run_sync(program, *args, "--dry-run")
    assert ran.code == 0, ran.stderr
    printed: dict[str, Any] = json.loads(ran.stdout)
    return printed, bytes.fromhex(printed["value"])


async def run_node(program: Path, stack: Stack, *args: str) -> Ran:
    """Run enqueue.mjs against the stack's broker and namespace (from the environment)."""
    process = await asyncio.create_subprocess_exec(
        "node",
        str(program),
        *args,
        cwd=REPO,
        env=node_env(EVSCHED_KAFKA_BOOTSTRAP=stack.bootstrap, EVSCHED_NAMESPACE=stack.namespace),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    async with asyncio.timeout(NODE_TIMEOUT_S):
        out, err = await process.communicate()
    assert process.returncode is not None
    return Ran(process.returncode, out.decode(), err.decode())


# --- encoding, ids and partitioner: no broker needed ---------------------------------------------


def test_node_writes_the_docs_worked_example_byte_for_byte(node_program: Path) -> None:
    example = example_event()
    assert example.trace is not None
    printed, value = dry_run(
        node_program,
        example.task,
        "--args",
        '["2026-03"]',
        "--kwargs",
        '{"force": true}',
        "--idempotency-key",
        example.idempotency_key or "",
        "--label",
        "team=billing",
        "--traceparent",
        example.trace.traceparent,
        "--event-id",
        example.event_id,
        "--emitted-at",
        str(example.emitted_at),
        "--source",
        example.source,
    )
    assert value == encode_event(example)
    assert printed["topic"] == "evsched.events"
    assert printed["key"] == printed["job_id"] == example.job_id


def test_what_node_writes_python_decodes_field_for_field(node_program: Path) -> None:
    kwargs = {"z": [1, {"b": None, "a": "ünï"}], "a": True}
    printed, value = dry_run(
        node_program,
        "s.effect",
        "--queue",
        "emails",
        "--args",
        '["x", 2]',
        "--kwargs",
        json.dumps(kwargs),
        "--delay-ms",
        "5000",
        "--priority=-3",
        "--max-attempts",
        "7",
        "--timeout-ms",
        "1500",
        "--label",
        "a=1",
        "--label",
        "b=x=y",
        "--traceparent",
        TRACEPARENT,
        "--tracestate",
        TRACESTATE,
    )
    event = decode_event(value)
    assert isinstance(event, JobEnqueued)
    assert encode_event(event) == value  # the same bytes evsched would write for these values
    assert event.job_id == printed["job_id"] and uuid.UUID(event.job_id).version == 4
    assert uuid.UUID(event.event_id).version == 4
    assert (event.task, event.queue, event.source) == ("s.effect", "emails", "client-node")
    assert (
        event.args
        == b'{"args":["x",2],"kwargs":{"a":true,"z":[1,{"a":"\xc3\xbcn\xc3\xaf","b":null}]}}'
    )
    assert event.run_at == event.emitted_at + 5000
    assert (event.priority, event.max_attempts, event.timeout_ms) == (-3, 7, 1500)
    assert event.labels == {"a": "1", "b": "x=y"}
    assert event.trace == TraceContext(traceparent=TRACEPARENT, tracestate=TRACESTATE)
    assert event.idempotency_key is None
    assert event.body_digest == ids.body_digest(event.task, event.queue, event.args)


@pytest.mark.parametrize(
    ("queue", "key"),
    [("default", "order-42"), ("mail", "order-42"), ("default", "clé ✓ 🚀"), ("q.x-1", "a\tb")],
)
def test_keyed_job_ids_from_node_equal_job_id_for_key(
    node_program: Path, queue: str, key: str
) -> None:
    printed, value = dry_run(node_program, "s.effect", "--queue", queue, "--idempotency-key", key)
    assert printed["job_id"] == ids.job_id_for_key(queue, key)
    event = decode_event(value)
    assert isinstance(event, JobEnqueued)
    assert (event.job_id, event.idempotency_key) == (printed["job_id"], key)


def test_kafkajs_default_partitioner_is_kafkas_murmur2(node_program: Path) -> None:
    keys = [str(uuid.uuid4()) for _ in range(300)]
    keys += ["", "a", "ab", "abc", "abcd", "é", "🚀", "nightly-report", "x" * 1000]
    script = """
        import kafkajs from 'kafkajs'
        const partition = kafkajs.Partitioners.DefaultPartitioner()
        const keys = JSON.parse(process.argv[1])
        const meta = (n) => Array.from({ length: n }, (_, i) => ({ partitionId: i, leader: 0 }))
        const out = keys.map((key) => [1, 2, 3, 6, 7, 12, 50].map(
            (n) => partition({ topic: 't', partitionMetadata: meta(n), message: { key } })))
        process.stdout.write(JSON.stringify(out))
    """
    done = subprocess.run(
        ["node", "--input-type=module", "-e", script, json.dumps(keys)],
        cwd=node_program.parent,
        capture_output=True,
        text=True,
        timeout=NODE_TIMEOUT_S,
        check=False,
        env=node_env(KAFKAJS_NO_PARTITIONER_WARNING="1"),
    )
    assert done.returncode == 0, done.stderr
    expected = [
        [(murmur2(key.encode()) & 0x7FFFFFFF) % n for n in (1, 2, 3, 6, 7, 12, 50)] for key in keys
    ]
    assert json.loads(done.stdout) == expected


@pytest.mark.parametrize(
    "args",
    [
        [],
        ["t", "--traceparent", "00-xyz"],
        ["t", "--tracestate", "a=b"],
        ["t", "--args", '{"not": "a list"}'],
        ["t", "--kwargs", "[1]"],
        ["t", "--idempotency-key", "k", "--job-id", "j"],
        ["t", "--idempotency-key", ""],
        ["t", "--queue", "bad queue"],
        ["t", "--max-attempts", "0"],
        ["t", "--no-such-option"],
    ],
)
def test_bad_command_lines_exit_2_and_send_nothing(node_program: Path, args: list[str]) -> None:
    # An unreachable bootstrap: a usage error must be reported before any connection attempt.
    ran = run_sync(node_program, *args, env=node_env(EVSCHED_KAFKA_BOOTSTRAP="127.0.0.1:9"))
    assert ran.code == 2, ran
    assert ran.stdout == ""
    assert "usage: node enqueue.mjs" in ran.stderr


# --- against a real node and worker --------------------------------------------------------------


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def stack(
    kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Stack]:
    namespace = unique_name("node")
    await ensure_topics(kafka_bootstrap, namespace, event_partitions=3, queues=["default"])
    engine = Stack(kafka_bootstrap, namespace, tmp_path_factory.mktemp("interop"))
    engine.start_node("node-1", "--dispatch-timeout-s", "10")
    engine.start_worker("worker-1", "--lease-s", "5")
    try:
        yield engine
        await engine.check(all_terminal=False)
    finally:
        await engine.close()


async def events_of(stack: Stack, job_id: str) -> list[tuple[Event, int]]:
    """The job's decoded events with their partitions, in log order."""
    events, bad = await stack.history()
    assert bad == []
    return [(e, p.partition) for e, p in events if getattr(e, "job_id", None) == job_id]


def expected_partition(job_id: str, partitions: int = 3) -> int:
    return (murmur2(job_id.encode()) & 0x7FFFFFFF) % partitions


def applied(timeline: Sequence[Any]) -> list[tuple[str, Verdict]]:
    return [(entry.kind, entry.verdict) for entry in timeline]


@pytest.mark.broker
@pytest.mark.asyncio(loop_scope="module")
async def test_a_job_enqueued_from_node_runs_on_a_python_worker_with_its_trace(
    node_program: Path, stack: Stack
) -> None:
    ran = await run_node(
        node_program,
        stack,
        "s.effect",
        "--args",
        '["from-node"]',
        "--traceparent",
        TRACEPARENT,
        "--tracestate",
        TRACESTATE,
    )
    assert ran.code == 0, ran.stderr
    job_id = ran.stdout.strip()
    landed = ran.landed()
    assert landed["topic"] == stack.topics.events
    assert landed["partition"] == expected_partition(job_id)

    state = await stack.wait_status(job_id, Status.SUCCEEDED)
    assert json.loads(state.result or b"null") == "from-node"

    async def effect_published() -> list[Any]:
        records = await stack.read_raw(stack.topics.effects)
        return [r for r in records if r.key == job_id.encode()]

    (effect,) = await wait_for(effect_published, what="the job's effect on the effects topic")
    assert json.loads(effect.value) == {"tag": "from-node"}
    assert effect_id(effect) == (job_id, state.token, 0)

    trace = TraceContext(traceparent=TRACEPARENT, tracestate=TRACESTATE)
    events = await events_of(stack, job_id)
    assert {partition for _, partition in events} == {landed["partition"]}
    enqueued = [e for e, _ in events if isinstance(e, JobEnqueued)]
    assert len(enqueued) == 1
    (sent,) = enqueued
    assert (sent.task, sent.queue, sent.source) == ("s.effect", "default", "client-node")
    assert sent.args == b'{"args":["from-node"],"kwargs":{}}'
    assert sent.trace == trace
    by_kind = {type(e): e for e, _ in events}
    for kind in (JobLeased, AttemptStarted, AttemptSucceeded):
        assert by_kind[kind].trace == trace, kind.__name__  # type: ignore[attr-defined]
    assert applied(await stack.timeline(job_id)) == [
        ("JobEnqueued", Verdict.APPLIED),
        ("JobLeased", Verdict.APPLIED),
        ("AttemptStarted", Verdict.APPLIED),
        ("AttemptSucceeded", Verdict.APPLIED),
    ]


@pytest.mark.broker
@pytest.mark.asyncio(loop_scope="module")
async def test_one_idempotency_key_from_node_and_python_makes_one_job(
    node_program: Path, stack: Stack
) -> None:
    key = unique_name("order-")
    first = await run_node(
        node_program, stack, "s.effect", "--args", '["k"]', "--idempotency-key", key
    )
    assert first.code == 0, first.stderr
    job_id = first.stdout.strip()
    assert job_id == ids.job_id_for_key("default", key)
    await stack.wait_status(job_id, Status.SUCCEEDED)

    async with stack.app() as app:
        again = await app.get_task("s.effect").options(idempotency_key=key).enqueue("k")
    assert again == job_id
    other = await run_node(
        node_program, stack, "s.effect", "--args", '["not k"]', "--idempotency-key", key
    )
    assert other.code == 0, other.stderr
    assert other.stdout.strip() == job_id

    async def judged() -> list[tuple[str, Verdict]] | None:
        timeline = applied(await stack.timeline(job_id))
        enqueues = [entry for entry in timeline if entry[0] == "JobEnqueued"]
        return enqueues if len(enqueues) == 3 else None

    assert await wait_for(judged, what="the three enqueues to be judged") == [
        ("JobEnqueued", Verdict.APPLIED),
        ("JobEnqueued", Verdict.DUPLICATE),  # Python: same key, same canonical args
        ("JobEnqueued", Verdict.CONFLICT),  # Node again: same key, other args
    ]
    state = await stack.job(job_id)
    assert state is not None and state.status is Status.SUCCEEDED and state.attempt == 1
    partitions = {partition for _, partition in await events_of(stack, job_id)}
    assert partitions == {expected_partition(job_id)}
