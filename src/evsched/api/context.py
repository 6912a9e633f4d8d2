"""What every request handler shares: the replica, the client, metrics, limits and the tokens."""

from __future__ import annotations

import asyncio
import hmac
from dataclasses import dataclass, field
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from evsched.adapters.kafka.queues import QueueCatalog
from evsched.api.as_of import PastSource
from evsched.api.auth import Tokens
from evsched.api.errors import ApiError
from evsched.api.reader import ReplicaView
from evsched.api.writes import Writer
from evsched.client.app import App
from evsched.metrics import Metrics
from evsched.settings import Settings

# Batches being built, written and judged at once; more wait their turn (see api.batch).
MAX_BATCHES_IN_FLIGHT = 2


@dataclass(slots=True, kw_only=True)
class ApiContext:
    settings: Settings
    replica: ReplicaView
    client: App
    metrics: Metrics
    writer: Writer
    tokens: Tokens = field(repr=False)
    queues: QueueCatalog
    max_scan: int
    ready_max_lag: int
    lag_timeout_s: float
    # ?as_of= reads: indexes rebuilt to a point of the log, and how long a request waits for one.
    past: PastSource
    as_of_wait_s: float
    batches: asyncio.Semaphore = field(
        default_factory=lambda: asyncio.Semaphore(MAX_BATCHES_IN_FLIGHT), repr=False
    )


def context(request: Request) -> ApiContext:
    found = request.app.state.evsched
    assert isinstance(found, ApiContext)
    return found


Ctx = Annotated[ApiContext, Depends(context)]

_bearer = HTTPBearer(
    auto_error=False,
    description="Writes need `Authorization: Bearer <token>` (the write token). Reads need the "
    "read or the write token when the API guards reads; otherwise they are open.",
)
Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]


def require_writer(ctx: Ctx, credentials: Credentials) -> None:
    """401 without a bearer token, 403 with one that may not write; nothing when auth is off."""
    write = ctx.tokens.write
    if write is None:
        return
    _check(credentials, (write,), "writes")


def require_reader(ctx: Ctx, credentials: Credentials) -> None:
    """401 without a bearer token, 403 with a wrong one; nothing when reads are open."""
    if not ctx.tokens.guard_reads:
        return
    allowed = tuple(t for t in (ctx.tokens.write, ctx.tokens.read) if t is not None)
    _check(credentials, allowed, "reads")


def _check(
    credentials: HTTPAuthorizationCredentials | None, allowed: tuple[str, ...], what: str
) -> None:
    if credentials is None:
        raise ApiError(
            401,
            "unauthorized",
            f"{what} need an Authorization: Bearer <token> header",
            headers={"WWW-Authenticate": "Bearer"},
        )
    given = credentials.credentials.encode()
    # Every token is compared, so the time taken does not tell which one came close.
    matches = [hmac.compare_digest(given, token.encode()) for token in allowed]
    if not any(matches):
        raise ApiError(403, "forbidden", f"this bearer token is not valid for {what}")


Writes = Depends(require_writer)
Reads = Depends(require_reader)
