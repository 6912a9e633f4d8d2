"""``evsched dev``: the whole local stack in one command — broker, node, worker and API.

It starts (or reuses) the local broker, provisions the namespace's topics, runs a node, a worker and
the API as child processes (with ``--with-postgres``, also a throw-away PostgreSQL with the outbox
table and an ``evsched relay``; its DSN in ``EVSCHED_OUTBOX_DSN``), each of their lines behind the
process's name (``worker │ ...``), optionally enqueues the example app's demo jobs, and on Ctrl-C
stops the children and the broker (and PostgreSQL) it started, by their pids. The broker logs to
files in its data dir, not to the terminal.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

import typer

from evsched.adapters.kafka.topics import ensure_topics
from evsched.adapters.proofs import KEY_ENV as NODE_KEY_ENV
from evsched.adapters.proofs import KEY_FILE_ENV as NODE_KEY_FILE_ENV
from evsched.adapters.proofs import generate_key as generate_node_key
from evsched.adapters.signing import KEY_ENV, KEY_FILE_ENV, DispatchKey
from evsched.devstack.broker import LocalBroker
from evsched.devstack.postgres import LocalPostgres
from evsched.devstack.process import free_port
from evsched.devstack.terminal import Terminal
from evsched.settings import DEFAULT_EVENT_PARTITIONS, DEFAULT_NAMESPACE, Settings

# Who writes on the dev stack's terminal: its processes, the broker's status and `evsched dev`.
NAMES = ("node", "worker", "api", "relay", "demo", "kafka", "db", "dev")
DSN_ENV = "EVSCHED_OUTBOX_DSN"
# How long the last lines of a stopped child may take to reach the terminal.
DRAIN_S = 5.0


@dataclass
class DevStack:
    app: str
    data_dir: Path
    namespace: str = DEFAULT_NAMESPACE
    partitions: int = DEFAULT_EVENT_PARTITIONS
    demo: bool = True
    api_port: int = 8080
    with_postgres: bool = False
    postgres: LocalPostgres | None = None
    children: list[subprocess.Popen[bytes]] = field(default_factory=list)
    started_broker: LocalBroker | None = None
    demo_process: subprocess.Popen[bytes] | None = None
    dispatch_key: str = field(default_factory=DispatchKey.generate, repr=False)
    node_key: str = field(default_factory=generate_node_key, repr=False)
    terminal: Terminal = field(default_factory=lambda: Terminal(NAMES), repr=False)
    followers: list[threading.Thread] = field(default_factory=list, repr=False)

    def env(self, bootstrap: str) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            EVSCHED_KAFKA_BOOTSTRAP=bootstrap,
            EVSCHED_NAMESPACE=self.namespace,
            EVSCHED_EVENT_PARTITIONS=str(self.partitions),
        )
        if not (env.get(KEY_ENV) or env.get(KEY_FILE_ENV)):
            # The dev stack's node and worker share a key made for this run (docs/security.md).
            env[KEY_ENV] = self.dispatch_key
        if not (env.get(NODE_KEY_ENV) or env.get(NODE_KEY_FILE_ENV)):
            # And the node keys, which the API needs too to judge proofs as the node does.
            env[NODE_KEY_ENV] = self.node_key
        cwd = os.getcwd()
        env["PYTHONPATH"] = os.pathsep.join(p for p in (cwd, env.get("PYTHONPATH", "")) if p)
        self.terminal.child_env(env)
        return env

    def run(self) -> None:
        """Start everything and wait; Ctrl-C, SIGTERM or SIGHUP stop all of it, at any point."""
        stop_on_signals()
        try:
            self._run()
        except KeyboardInterrupt:
            self.terminal.write("dev", "stopping…")
        finally:
            self.stop()

    def _run(self) -> None:
        broker = LocalBroker()
        status = broker.up()
        if not getattr(status, "already_running", False):
            self.started_broker = broker
        bootstrap = status.bootstrap
        self.terminal.write(
            "kafka", f"{bootstrap} (pid {status.pid}); its log: {broker.files.server_log}"
        )
        queues = self._queues()
        asyncio.run(
            ensure_topics(
                bootstrap,
                self.namespace,
                event_partitions=self.partitions,
                queues=queues,
                # The node and worker read it from the same environment: topics they accept.
                dispatch_partitions=Settings.from_env().dispatch_partitions,
            )
        )
        env = self.env(bootstrap)
        if self.with_postgres:
            env[DSN_ENV] = self._start_postgres()
            self._spawn(env, "relay", "--dsn", env[DSN_ENV])
        self._spawn(env, "node", "--data-dir", str(self.data_dir / "node"), "--node-id", "dev")
        self._spawn(env, "worker", "--app", self.app)
        api_dir = str(self.data_dir / "api")
        # A local stack on loopback: no token unless the developer set one.
        has_token = env.get("EVSCHED_API_TOKEN") or env.get("EVSCHED_API_TOKEN_FILE")
        auth = [] if has_token else ["--no-auth"]
        self._spawn(
            env,
            "api",
            "--app",
            self.app,
            "--data-dir",
            api_dir,
            "--port",
            str(self.api_port),
            *auth,
        )
        self._explain(bootstrap)
        if self.demo:
            # The app module's own main() is the demo workload (examples.app enqueues a few jobs).
            module = self.app.partition(":")[0]
            self.demo_process = self._start("demo", [sys.executable, "-m", module], env)
        self._wait()

    def _start_postgres(self) -> str:
        """A throw-away PostgreSQL for the demo, with the outbox table: its DSN."""
        from evsched.outbox import init_table_sync  # noqa: PLC0415 — the outbox extra

        # Under /tmp: as root the server runs as the postgres user, who must reach its files.
        server = LocalPostgres(Path(tempfile.mkdtemp(prefix="evsched-dev-pg-")), free_port())
        self.postgres = server
        status = server.up()
        init_table_sync(status.dsn)
        self.terminal.write("db", f"{status.dsn} (pid {status.pid}); outbox table ready")
        return status.dsn

    def _queues(self) -> list[str]:
        from evsched.client.loader import load_app  # noqa: PLC0415 — imports the user's app

        if os.getcwd() not in sys.path:
            sys.path.insert(0, os.getcwd())
        return list(load_app(self.app).queues)

    def _spawn(self, env: dict[str, str], command: str, *args: str) -> None:
        argv = [sys.executable, "-m", "evsched", command, *args, "--log-console"]
        self.children.append(self._start(command, argv, env))

    def _start(self, name: str, argv: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        """A child whose stdout and stderr reach the terminal behind ``name``."""
        child = subprocess.Popen(
            argv,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        assert child.stdout is not None  # stdout=PIPE
        self.followers.append(self.terminal.follow(name, child.stdout))
        return child

    def _explain(self, bootstrap: str) -> None:
        api = f"http://127.0.0.1:{self.api_port}"
        self.terminal.write(
            "dev",
            f"node, worker and API are running in namespace {self.namespace!r}; "
            f"indexes under {self.data_dir}\n"
            f"dashboard:            {api}/\n"
            f"API and its docs:     {api}/docs   (jobs: {api}/v1/jobs, metrics: {api}/metrics)\n"
            f"enqueue from Python:  EVSCHED_KAFKA_BOOTSTRAP={bootstrap} python -m examples.app\n"
            f"enqueue over HTTP:    curl -X POST {api}/v1/jobs -H 'content-type: application/json'"
            """ -d '{"task": "example.noop"}'\n"""
            + (
                f"outbox database:      {DSN_ENV}={self.postgres.dsn} (docs/outbox.md)\n"
                if self.postgres is not None
                else ""
            )
            + "stop everything:      Ctrl-C",
        )

    def _wait(self) -> None:
        """Until Ctrl-C (or SIGTERM, SIGHUP), or until a child exits on its own."""
        while all(child.poll() is None for child in self.children):
            try:
                self.children[0].wait(timeout=0.5)
            except subprocess.TimeoutExpired:
                continue

    def stop(self) -> None:
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                signal.signal(signum, signal.SIG_IGN)  # a second Ctrl-C must not cut this short
        if self.demo_process is not None:
            self.children.append(self.demo_process)
        for child in self.children:
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)
        for child in self.children:
            try:
                child.wait(timeout=30)
            except subprocess.TimeoutExpired:
                child.kill()
        for follower in self.followers:
            follower.join(DRAIN_S)
        if self.started_broker is not None:
            self.started_broker.down()
            self.terminal.write("kafka", "stopped")
        self._stop_postgres()

    def _stop_postgres(self) -> None:
        if self.postgres is not None:
            self.postgres.down()
            shutil.rmtree(self.postgres.data_dir, ignore_errors=True)
            self.terminal.write("db", "stopped")


def stop_on_signals() -> None:
    """SIGTERM and SIGHUP stop the stack as Ctrl-C does, and so does SIGINT when a shell started
    ``evsched dev`` in the background with SIGINT ignored: its children never outlive it."""

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)

    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, interrupt)


def dev_command(
    app_ref: Annotated[
        str, typer.Option("--app", help="The App to serve, as module:attribute.")
    ] = "examples.app:app",
    data_dir: Annotated[
        Path, typer.Option("--data-dir", help="Node indexes for the dev stack.")
    ] = Path("./evsched-data/dev"),
    demo: Annotated[
        bool, typer.Option("--demo/--no-demo", help="Run the app module's main() once.")
    ] = True,
    api_port: Annotated[int, typer.Option("--api-port", min=1, max=65_535)] = 8080,
    with_postgres: Annotated[
        bool,
        typer.Option(
            "--with-postgres",
            help="Also a throw-away PostgreSQL with the outbox table, and an evsched relay.",
        ),
    ] = False,
) -> None:
    """Run the local stack: broker, node, worker and API with an app; Ctrl-C stops it all."""
    DevStack(
        app=app_ref, data_dir=data_dir, demo=demo, api_port=api_port, with_postgres=with_postgres
    ).run()
