"""The FastAPI application: routes over a read replica, writes through the client library."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager

import structlog
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from evsched import __version__
from evsched.adapters.kafka.queues import KafkaQueues, QueueCatalog
from evsched.api import (
    batch,
    controls,
    dashboard,
    jobs,
    limits,
    reader,
    schedules,
    status,
    undecodable,
    workflows,
)
from evsched.api.as_of import PastSource, RebuiltIndexes
from evsched.api.auth import Tokens
from evsched.api.context import ApiContext, Reads
from evsched.api.dashboard import StreamCaps
from evsched.api.errors import BodyLimit, install_error_handlers
from evsched.api.headers import SecurityHeaders
from evsched.api.models import Accepted
from evsched.api.past import StillBuilding, building
from evsched.api.reader import ReplicaView
from evsched.api.writes import NotYetApplied, Writer
from evsched.client.app import App
from evsched.core.state import FoldedEvent
from evsched.metrics import Metrics
from evsched.runtime.projection.projector import CommitHook
from evsched.runtime.projection.waiting import WaitingForWorker
from evsched.settings import Settings

log = structlog.get_logger("evsched.api")
Lifespan = Callable[[FastAPI], AbstractAsyncContextManager[None]]

DESCRIPTION = """\
HTTP access to evsched. Writes answer once the broker acknowledged them (acks=all) **and** this
API's read replica has folded them, so the response carries the fold's verdict. Writes need
`Authorization: Bearer <token>` (the write token); reads need the read or the write token when
the API guards reads, and are open otherwise. `/healthz`, `/readyz` and `/metrics` are always
open. Every error has the body `{"error": {"code", "message", "field"}}`.

A job may wait on other jobs (`after` on `POST /v1/jobs`): the *workflows* routes show the graph
of such jobs and cancel or requeue a whole workflow.
"""
TAGS = [
    {
        "name": "workflows",
        "description": "Jobs that wait on other jobs: `GET /v1/jobs/{id}/workflow` shows every "
        "job reachable from one through parents and children, with each parent's resolution "
        "(its outcome and the partition@offset of the parent's end); `.../workflow/cancel` and "
        "`.../workflow/requeue` act on all of them in one Kafka transaction.",
    }
]


def create_app(
    settings: Settings,
    *,
    replica: ReplicaView,
    app: App | None = None,
    token: str | None = None,
    tokens: Tokens | None = None,
    queues: QueueCatalog | None = None,
    metrics: Metrics | None = None,
    start_replica: bool = False,
    wait_timeout_s: float = 10.0,
    ready_max_lag: int = 1_000,
    max_body_bytes: int = 1 << 20,
    max_scan: int = 5_000,
    lag_timeout_s: float = 2.0,
    close_app: bool | None = None,
    live_streams: StreamCaps | None = None,
    past: PastSource | None = None,
    as_of_wait_s: float = 10.0,
) -> FastAPI:
    """The API over ``replica``, writing through ``app`` (an evsched App; one is made if None).

    ``app``'s task definitions, if any, lend their defaults and signature checks to enqueues of
    those names. With ``start_replica`` the app's lifespan starts and stops the replica (what
    ``evsched api`` does); otherwise the caller does. The client is closed at shutdown when
    ``close_app`` (default: when it was made here). ``queues`` tells the declared queues
    (default: those whose dispatch topic exists in the cluster). ``metrics`` is hooked to the
    replica's commits unless the replica already calls it. ``tokens`` (or just a write
    ``token``) guard the routes; neither: no authentication, which ``evsched api`` serves only
    with ``--no-auth``. ``live_streams`` caps the dashboard's open ``/live`` streams.
    ``past`` serves ``?as_of=`` (default: indexes rebuilt by ``evsched rebuild --until`` into a
    temporary directory); a request waits ``as_of_wait_s`` for one being built, then gets a 202.
    """
    if tokens is None:
        tokens = Tokens(write=token)  # an empty token is refused there, not taken for "no auth"
    elif token is not None:
        raise ValueError("pass token or tokens, not both")
    metrics = metrics if metrics is not None else Metrics()
    metrics.followers.append(WaitingForWorker(metrics.registry).observe)
    _hook(replica, metrics.observe_commit)
    queues = queues if queues is not None else KafkaQueues(settings)
    # The API checks queues itself (a 422): its client asks the same catalog, answered from cache.
    client = app if app is not None else App(settings, name="api", queues=queues)
    close_client = app is None if close_app is None else close_app
    ctx = ApiContext(
        settings=settings,
        replica=replica,
        client=client,
        metrics=metrics,
        writer=Writer(client, replica, metrics, wait_timeout_s),
        tokens=tokens,
        queues=queues,
        max_scan=max_scan,
        ready_max_lag=ready_max_lag,
        lag_timeout_s=lag_timeout_s,
        past=past if past is not None else RebuiltIndexes(settings),
        as_of_wait_s=as_of_wait_s,
    )

    api = FastAPI(
        title="evsched",
        version=__version__,
        description=DESCRIPTION,
        openapi_tags=TAGS,
        lifespan=_lifespan(ctx, start_replica=start_replica, close_client=close_client),
    )
    api.state.evsched = ctx
    api.add_middleware(BodyLimit, limit=max_body_bytes)
    api.add_middleware(SecurityHeaders)  # outside BodyLimit: its 413s get the headers too
    install_error_handlers(api)
    api.add_exception_handler(NotYetApplied, _accepted)
    api.add_exception_handler(StillBuilding, building)
    # Read routes declare (in OpenAPI too) the token they need only when reads are guarded.
    guard = [Reads] if tokens.guard_reads else []
    routers = (jobs.router, workflows.router, schedules.router, status.reads, undecodable.router)
    for router in (*routers, controls.router, limits.router, batch.router):
        api.include_router(router, dependencies=guard)
    api.include_router(status.router)
    metrics.followers.append(dashboard.install(api, ctx, live_streams).live.observe_commit)
    if replica.running:
        _seed(ctx)
    return api


def _lifespan(ctx: ApiContext, *, start_replica: bool, close_client: bool) -> Lifespan:
    """Startup: the replica (if ours to start) and the job counts; shutdown: what we opened."""

    @asynccontextmanager
    async def lifespan(api: FastAPI) -> AsyncIterator[None]:
        if start_replica:
            await ctx.replica.start()
        _seed(ctx)
        log.info("api_started", namespace=ctx.settings.namespace, tokens=repr(ctx.tokens))
        try:
            yield
        finally:
            api.state.evsched_dashboard.live.close()
            await api.state.evsched_dashboard.facts.close()
            await ctx.past.close()
            if close_client:
                await ctx.client.close()
            if start_replica:
                await ctx.replica.stop()
            log.info("api_stopped")

    return lifespan


async def _accepted(_: Request, exc: Exception) -> JSONResponse:
    """The write's verdict is not known yet: 202, how far it got, and where to look for it."""
    assert isinstance(exc, NotYetApplied)
    if exc.appended is None:
        body = Accepted(
            id=exc.entity,
            status="unconfirmed",
            partition=None,
            offset=None,
            message="the broker has not acknowledged the write in time; it may still be "
            "written: poll the Location, or retry with the same Idempotency-Key",
        )
    else:
        body = Accepted(
            id=exc.entity,
            status="acknowledged",
            partition=exc.appended.partition,
            offset=exc.appended.offset,
            message="acknowledged by the broker; this replica has not applied it yet",
        )
    return JSONResponse(body.model_dump(), status_code=202, headers={"Location": exc.location})


def _hook(replica: ReplicaView, observe: CommitHook) -> None:
    """Make ``observe`` see every batch the replica commits, alongside any hook it already has."""
    current = replica.on_commit
    if current == observe:
        return
    hook = observe if current is None else _both(current, observe)
    replica.on_commit = hook
    for projector in replica.projectors.values():
        projector.on_commit = hook


def _both(first: CommitHook, second: CommitHook) -> CommitHook:
    def both(events: Sequence[FoldedEvent]) -> None:
        first(events)
        second(events)

    return both


def _seed(ctx: ApiContext) -> None:
    """Count the jobs already in the indexes once; the commit hook keeps the counts after that."""
    indexes = [ctx.replica.index(p) for p in reader.partitions(ctx.replica)]
    counted = ctx.metrics.jobs.seed(indexes)
    log.info("job_counts_seeded", jobs=counted, partitions=len(indexes))
