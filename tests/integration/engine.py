"""A harness for engine scenarios: real node and worker processes on the real broker, a replica to
watch job states, and checks of what actually landed in the log (invariants, effects)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import typer
from aiokafka import TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.records_to_delete import RecordsToDelete
from aiokafka.errors import GroupCoordinatorNotAvailableError
from tests.conftest import unique_name
from typer.testing import CliRunner

from evsched.adapters import avro
from evsched.adapters.kafka import clients as kafka
from evsched.adapters.kafka.topics import Topics, ensure_topics, partition_count
from evsched.adapters.proofs import LogProofs, NodeKeyring, proof_of
from evsched.adapters.proofs import generate_key as generate_node_key
from evsched.adapters.signing import DispatchKey
from evsched.client import App
from evsched.core.events import AttemptSucceeded, Event, Position
from evsched.core.invariants import Replay, replay
from evsched.core.state import TERMINAL_STATUSES, JobState, Status, TimelineEntry, Verdict
from evsched.errors import DecodeError
from evsched.operator import register
from evsched.ports import Record
from evsched.runtime.replica import Replica
from evsched.settings import Settings

REPO = Path(__file__).resolve().parents[2]
DEADLINE_S = 60.0
T = TypeVar("T")


async def wait_for(
    probe: Callable[[], Awaitable[T | None]], *, what: str, timeout_s: float = DEADLINE_S
) -> T:
    """Poll ``probe`` until it returns something truthy; fail naming ``what`` at the deadline."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = await probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        await asyncio.sleep(0.05)


async def wait_path(path: Path, *, what: str = "", timeout_s: float = DEADLINE_S) -> None:
    """Wait until ``path`` exists (a marker a handler or a process writes)."""

    async def exists() -> bool:
        return await asyncio.to_thread(path.exists)

    await wait_for(exists, what=what or f"the marker {path}", timeout_s=timeout_s)


async def all_succeeded(reader: Stack | Replica, job_ids: Iterable[str]) -> bool:
    """Whether every job of ``job_ids`` has succeeded, as ``reader`` has folded it so far."""
    states = [await reader.job(j) for j in job_ids]
    return all(s is not None and s.status is Status.SUCCEEDED for s in states)


@dataclass
class Proc:
    """A node or worker process we started; stopped only by its own pid."""

    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path

    @property
    def pid(self) -> int:
        return self.popen.pid

    def signal(self, signum: int) -> None:
        if self.popen.poll() is None:
            os.kill(self.pid, signum)

    def kill(self) -> None:
        self.signal(signal.SIGKILL)
        self.popen.wait(timeout=30)

    def stop(self, timeout_s: float = 30.0) -> int:
        self.signal(signal.SIGCONT)  # a frozen process can't handle SIGTERM
        self.signal(signal.SIGTERM)
        try:
            return self.popen.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            return -9

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def logged(proc: Proc, event: str) -> list[dict[str, Any]]:
    """The JSON log lines of ``proc`` whose event name is ``event``, in order."""
    return [json.loads(line) for line in proc.log().splitlines() if f'"event": "{event}"' in line]


@dataclass
class Stack:
    """One namespace's engine: processes, a client app and a replica, all on one broker."""

    bootstrap: str
    namespace: str
    tmp: Path
    partitions: int = 3
    procs: list[Proc] = field(default_factory=list)
    # The namespace's dispatch key, handed to nodes and workers through their environment.
    dispatch_key: str = field(default_factory=DispatchKey.generate, repr=False)
    # The node keys (adapters.proofs): nodes prove their facts, and the API checks proofs.
    node_key: str = field(default_factory=generate_node_key, repr=False)
    _replica: Replica | None = None

    @property
    def settings(self) -> Settings:
        return Settings(
            bootstrap=self.bootstrap, namespace=self.namespace, event_partitions=self.partitions
        )

    @property
    def keyring(self) -> NodeKeyring:
        """The stack's node keys: its replica and ``history`` check proofs as its nodes do."""
        return NodeKeyring(self.node_key)

    @property
    def topics(self) -> Topics:
        return Topics(self.namespace)

    def __post_init__(self) -> None:
        # This test process folds the stack's log like one of its operators (its replica,
        # rebuilds and restores read the keys from the environment): with its node keys.
        os.environ["EVSCHED_NODE_KEY"] = self.node_key

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            EVSCHED_KAFKA_BOOTSTRAP=self.bootstrap,
            EVSCHED_NAMESPACE=self.namespace,
            EVSCHED_EVENT_PARTITIONS=str(self.partitions),
            EVSCHED_DISPATCH_KEY=self.dispatch_key,
            EVSCHED_NODE_KEY=self.node_key,
            # This checkout's code first: the venv's editable install may point at another one.
            PYTHONPATH=os.pathsep.join([str(REPO / "src"), str(REPO)]),
        )
        return env

    def _spawn(self, name: str, args: list[str]) -> Proc:
        log_path = self.tmp / f"{name}.log"
        with log_path.open("ab") as out:
            popen = subprocess.Popen(
                [sys.executable, "-m", "evsched", *args],
                cwd=REPO,
                env=self.env(),
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        proc = Proc(name, popen, log_path)
        self.procs.append(proc)
        return proc

    def start_node(self, name: str = "node-1", *args: str) -> Proc:
        data = self.tmp / name
        return self._spawn(name, ["node", "--data-dir", str(data), "--node-id", name, *args])

    def node_data(self, name: str = "node-1") -> Path:
        return self.tmp / name

    async def rebuild_verify(self, node: str, data_dir: Path) -> tuple[int, Any]:
        """``evsched rebuild --verify --live-dir <node's data> --json``: (exit code, document)."""
        process = await asyncio.create_subprocess_exec(
            *[sys.executable, "-m", "evsched", "rebuild", "--verify", "--json"],
            *["--live-dir", str(self.node_data(node)), "--data-dir", str(data_dir)],
            *["--processes", "1"],
            cwd=REPO,
            env=self.env(),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await process.communicate()
        assert process.returncode is not None
        if not out.strip():
            return process.returncode, err.decode()
        return process.returncode, json.loads(out)

    def start_worker(
        self, name: str = "worker-1", *args: str, app: str = "tests.integration.scenario_app:app"
    ) -> Proc:
        return self._spawn(name, ["worker", "--app", app, *args])

    def app(self) -> App:
        from tests.integration.scenario_app import make_app

        return make_app(self.settings)

    async def enqueue_effects(self, count: int, tag: str) -> list[str]:
        """``count`` jobs of the scenario app's ``s.effect`` task, args tagged with ``tag``."""
        async with self.app() as app:
            task = app.get_task("s.effect")
            return [await task.enqueue(f"{tag}-{i}") for i in range(count)]

    async def replica(self) -> Replica:
        if self._replica is None:
            self._replica = Replica(self.settings, self.tmp / "replica", keyring=self.keyring)
            await self._replica.start()
        return self._replica

    async def job(self, job_id: str) -> JobState | None:
        return await (await self.replica()).job(job_id)

    async def wait_status(
        self, job_id: str, *statuses: Status, timeout_s: float = DEADLINE_S
    ) -> JobState:
        async def probe() -> JobState | None:
            state = await self.job(job_id)
            return state if state is not None and state.status in statuses else None

        return await wait_for(probe, what=f"job {job_id} to be {statuses}", timeout_s=timeout_s)

    async def timeline(self, job_id: str) -> list[TimelineEntry]:
        """The job's timeline as the replica has folded it so far."""
        return (await self.replica()).timeline(job_id)

    async def node_committed(self, partition: int) -> int | None:
        """The nodes group's committed offset on an events partition, None before any commit.

        A node commits it in the transaction that carries what it emitted for the records below
        it (effects, decisions): past an offset, the owner has acted on that record.
        """
        admin = AIOKafkaAdminClient(
            bootstrap_servers=self.bootstrap, **dict(self.settings.kafka_options)
        )
        await admin.start()
        try:
            offsets = await admin.list_consumer_group_offsets(f"{self.namespace}.nodes")
        except GroupCoordinatorNotAvailableError:
            return None  # the broker does not know the group's coordinator yet: ask again later
        finally:
            await admin.close()
        committed = offsets.get(TopicPartition(self.topics.events, partition))
        return None if committed is None or committed.offset < 0 else committed.offset

    async def wait_node_past(
        self, partition: int, offset: int, timeout_s: float = DEADLINE_S
    ) -> None:
        """Wait until a node has folded (and committed its outputs for) ``offset``."""

        async def past() -> bool:
            committed = await self.node_committed(partition)
            return committed is not None and committed > offset

        await wait_for(
            past, what=f"a node past offset {offset} of p{partition}", timeout_s=timeout_s
        )

    async def trim(self, before: Mapping[int, int]) -> None:
        """delete_records: everything of each events partition below ``before[partition]`` goes."""
        admin = AIOKafkaAdminClient(bootstrap_servers=self.bootstrap)
        await admin.start()
        try:
            await admin.delete_records(
                {
                    TopicPartition(self.topics.events, p): RecordsToDelete(before_offset=offset)
                    for p, offset in before.items()
                },
                timeout_ms=30_000,
            )
        finally:
            await admin.close()

    async def close(self) -> None:
        # Every process at once: each takes its own time to leave its groups and exit, and one
        # stopped after another, those times added up in every test's teardown.
        await asyncio.gather(*(asyncio.to_thread(proc.stop) for proc in self.procs))
        if self._replica is not None:
            await self._replica.stop()

    # --- what is in the log ------------------------------------------------------------------

    async def read_topic(self, topic: str) -> list[Record]:
        """Every committed record of ``topic``, from the start to its current end."""
        return [kafka.to_record(r) for r in await self.read_raw(topic)]

    async def read_raw(self, topic: str) -> list[Any]:
        """Every committed consumer record of ``topic`` (headers included)."""
        count = await partition_count(self.bootstrap, topic)
        tps = [TopicPartition(topic, p) for p in range(count)]
        consumer = kafka.consumer(self.settings, group_id=None, client_id="it-reader")
        await consumer.start()
        try:
            consumer.assign(tps)
            await consumer.seek_to_beginning(*tps)
            end = await consumer.end_offsets(tps)
            records: list[Any] = []
            while any([await consumer.position(tp) < end[tp] for tp in tps]):
                batch = await consumer.getmany(timeout_ms=200)
                records += [r for rs in batch.values() for r in rs]
            return records
        finally:
            await consumer.stop()

    async def history(self) -> tuple[list[tuple[Event, Position]], list[Record]]:
        """The decoded events with positions, in log order per partition; and undecodable ones."""
        events: list[tuple[Event, Position]] = []
        bad: list[Record] = []
        proofs = LogProofs(self.keyring)
        for record in sorted(
            await self.read_topic(self.topics.events), key=lambda r: (r.partition, r.offset)
        ):
            try:
                event = avro.decode_event(record.value or b"")
            except DecodeError:
                bad.append(record)
                continue
            position = proofs.partition(record.partition).position(
                partition=record.partition,
                offset=record.offset,
                log_at=record.log_at,
                event=event,
                value=record.value or b"",
                proof=proof_of(record.headers),
            )
            events.append((event, position))
        return events, bad

    async def check(self, *, all_terminal: bool = True) -> Replay:
        """I1/I6/I7 on the log, effects = effects of applied successes, I3 when asked.

        Effects are published by the node that folds the success, which may trail the log a
        little: missing effects are waited for (with a deadline), duplicates fail at once.
        """
        deadline = time.monotonic() + DEADLINE_S
        while True:
            events, _ = await self.history()
            folded = replay(events)
            assert folded.violations == [], folded.violations
            expected = set(_expected_effects(folded, events))
            published = Counter(effect_id(r) for r in await self.read_raw(self.topics.effects))
            twice = [e for e, n in published.items() if n > 1]
            unexpected = set(published) - expected
            assert not twice, f"effects published twice: {twice[:5]}"
            assert not unexpected, f"effects of rejected completions: {sorted(unexpected)[:5]}"
            missing = expected - set(published)
            if not missing:
                break
            assert time.monotonic() < deadline, f"effects never published: {sorted(missing)[:5]}"
            await asyncio.sleep(0.2)
        if all_terminal:
            stuck = {
                j: s.status for j, s in folded.jobs.items() if s.status not in TERMINAL_STATUSES
            }
            assert not stuck, f"jobs not terminal: {stuck}"
        return folded


class Operator:
    """``evsched`` operator commands on ``stack``'s namespace, run in a thread (each runs its own
    event loop), with a local replica of their own."""

    def __init__(self, stack: Stack) -> None:
        self.app = typer.Typer()
        register(self.app)
        self.env = {
            "EVSCHED_KAFKA_BOOTSTRAP": stack.bootstrap,
            "EVSCHED_NAMESPACE": stack.namespace,
            "EVSCHED_EVENT_PARTITIONS": str(stack.partitions),
            # An operator holds the node keys, to judge proofs as the nodes do (docs/security.md).
            "EVSCHED_NODE_KEY": stack.node_key,
            "EVSCHED_REPLICA_DATA_DIR": str(stack.tmp / "operator-replica"),
            "COLUMNS": "200",
        }

    async def run(self, *args: str) -> tuple[int, str]:
        result = await asyncio.to_thread(CliRunner().invoke, self.app, list(args), env=self.env)
        return result.exit_code, result.output

    async def json(self, *args: str, code: int = 0) -> Any:
        exit_code, output = await self.run(*args, "--json")
        assert exit_code == code, output
        return json.loads(output)


@asynccontextmanager
async def node_and_worker(
    bootstrap: str, tmp_path: Path, prefix: str
) -> AsyncIterator[tuple[Stack, Proc]]:
    """A fresh namespace of three partitions with one node (dispatch timeout 10 s) and one
    worker (leases of 3 s); the stack and the node's process."""
    namespace = unique_name(prefix)
    await ensure_topics(bootstrap, namespace, event_partitions=3, queues=["default"])
    stack = Stack(bootstrap, namespace, tmp_path)
    node = stack.start_node("node-1", "--dispatch-timeout-s", "10")
    stack.start_worker("worker-1", "--lease-s", "3")
    try:
        yield stack, node
    finally:
        await stack.close()


def effect_id(record: Any) -> tuple[str, int, int]:
    """(job id, token, index) from an effects record's headers."""
    headers = dict(record.headers or ())
    return (
        headers["evsched-job-id"].decode(),
        int(headers["evsched-token"]),
        int(headers["evsched-effect-index"]),
    )


def _expected_effects(
    folded: Replay, events: list[tuple[Event, Position]]
) -> list[tuple[str, int, int]]:
    """(job, token, index) of every effect of every applied AttemptSucceeded."""
    applied = {
        (job_id, entry.offset, entry.partition)
        for job_id, timeline in folded.job_timelines.items()
        for entry in timeline
        if entry.kind == "AttemptSucceeded" and entry.verdict is Verdict.APPLIED
    }
    return [
        (event.job_id, event.token, i)
        for event, position in events
        if isinstance(event, AttemptSucceeded)
        and (event.job_id, position.offset, position.partition) in applied
        for i in range(len(event.effects))
    ]
