"""Schemathesis against the OpenAPI document: generated requests, valid and not, never get a 5xx,
and every response conforms to the document (status, content type, headers, body schema, the
`Allow` of a 405).

The API runs over the in-memory twins (the real fold and index, no broker), with a token, which
the calls carry so writes get past auth and reach validation and the fold.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from fastapi import FastAPI
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    allow_header_conformance,
    content_type_conformance,
    negative_data_rejection,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from evsched.adapters.kafka.queues import FixedQueues
from evsched.adapters.kafka.topics import Topics
from evsched.api import create_app
from evsched.client import App
from evsched.testing import MemoryLog
from tests.unit.api.test_api_twin import QUEUES, SETTINGS, TOKEN, MemoryReplica

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    negative_data_rejection,
    allow_header_conformance,
]


@pytest.fixture(scope="module")
def api_app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FastAPI]:
    log = MemoryLog()
    replica = MemoryReplica(log, tmp_path_factory.mktemp("schema"), topic=Topics("apitest").events)
    client = App(SETTINGS, log_factory=lambda: log)
    asyncio.run(replica.start())
    try:
        yield create_app(
            SETTINGS,
            replica=replica,
            app=client,
            token=TOKEN,
            max_scan=200,
            queues=FixedQueues(QUEUES),
        )
    finally:
        asyncio.run(client.close())
        asyncio.run(replica.stop())


def _document() -> dict[str, Any]:
    """The OpenAPI document, built at import so that pytest can collect one test per operation.

    The replica is never started: building the document reads nothing from it.
    """
    log = MemoryLog()
    idle = MemoryReplica(log, Path("/nonexistent"), topic=Topics("apitest").events)
    client = App(SETTINGS, log_factory=lambda: log)
    return create_app(
        SETTINGS, replica=idle, app=client, token=TOKEN, queues=FixedQueues(QUEUES)
    ).openapi()


schema = schemathesis.openapi.from_dict(_document())


@schema.parametrize()
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
def test_api_conforms_to_its_openapi_document(case: Any, api_app: FastAPI) -> None:
    case.call_and_validate(
        app=api_app,
        base_url="http://testserver",
        headers={"Authorization": f"Bearer {TOKEN}"},
        checks=CHECKS,
    )
