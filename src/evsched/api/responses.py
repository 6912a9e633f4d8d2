"""What each kind of operation may answer besides success, declared for the OpenAPI document."""

from __future__ import annotations

from typing import Any

from evsched.api.errors import ErrorBody
from evsched.api.models import Accepted

Responses = dict[int | str, dict[str, Any]]


def error(description: str) -> dict[str, Any]:
    return {"model": ErrorBody, "description": description}


READ: Responses = {
    401: error("Reads are guarded and the request has no token."),
    403: error("Wrong token."),
    422: error("Invalid parameters."),
}
WRITE: Responses = {
    202: {
        "model": Accepted,
        "description": "Not yet applied by this replica, or not yet acknowledged by the broker.",
    },
    400: error("The body could not be read as UTF-8 JSON."),
    401: error("A token is configured and the request has none."),
    403: error("Wrong token."),
    413: error("Body too large."),
    422: error("Invalid body or parameters, or a queue that is not declared."),
    503: error(
        "The broker did not acknowledge the write: `broker_unavailable`, or "
        "`not_enough_replicas` (with Retry-After) when its partition has no leader or fewer "
        "in-sync replicas than min.insync.replicas; retriable."
    ),
}
