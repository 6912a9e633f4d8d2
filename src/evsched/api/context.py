"""What every request handler shares: the replica, the client, metrics, limits and the token."""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from evsched.api.errors import ApiError
from evsched.api.reader import ReplicaView
from evsched.api.writes import Writer
from evsched.client.app import App
from evsched.metrics import Metrics
from evsched.settings import Settings


@dataclass(slots=True, kw_only=True)
class ApiContext:
    settings: Settings
    replica: ReplicaView
    client: App
    metrics: Metrics
    writer: Writer
    token: str | None
    max_scan: int
    ready_max_lag: int
    lag_timeout_s: float


def context(request: Request) -> ApiContext:
    found = request.app.state.evsched
    assert isinstance(found, ApiContext)
    return found


Ctx = Annotated[ApiContext, Depends(context)]

_bearer = HTTPBearer(
    auto_error=False,
    description="Writes need `Authorization: Bearer <token>` when the API has a token; "
    "reads never do.",
)


def require_writer(
    ctx: Ctx, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
) -> None:
    """401 without a bearer token, 403 with a wrong one; nothing to check when none is set."""
    if ctx.token is None:
        return
    if credentials is None:
        raise ApiError(
            401,
            "unauthorized",
            "writes need an Authorization: Bearer <token> header",
            headers={"WWW-Authenticate": "Bearer"},
        )
    if not hmac.compare_digest(credentials.credentials.encode(), ctx.token.encode()):
        raise ApiError(403, "forbidden", "this bearer token may not write")


Writes = Depends(require_writer)
