"""The map's walks (docs/architecture.md) as checks: each step of a walk holds for every thing of
its kind that exists, so a newcomer who leaves a step out is told which one here. Walks (b) and
(e) were each followed once by a commit (``evsched schedules show``, ``GET /v1/queues``); their
checks below keep every command and route documented."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any, get_args, get_type_hints

import pytest
import typer

from evsched.adapters.archive.history_file import read_history
from evsched.api import create_app
from evsched.api.models import Retry, RetryRequest
from evsched.cli import app as cli_app
from evsched.client.limits import limit_event
from evsched.core.events import EVENT_TYPES, EventFamily, RetryPolicy
from evsched.core.routing import event_types
from evsched.settings import Settings
from evsched.testing import MemoryLog
from tests.unit.api.test_api_twin import MemoryReplica

ROOT = Path(__file__).resolve().parents[3]
DOCS = ROOT / "docs"


def _schema(path: Path) -> dict[str, Any]:
    document: dict[str, Any] = json.loads(path.read_text())
    return document


def _record_fields(schema: dict[str, Any], field: str) -> list[str]:
    """The field names of the record type of ``field`` (a record, or a union with null)."""
    (found,) = [f for f in schema["fields"] if f["name"] == field]
    kind = found["type"]
    if isinstance(kind, list):
        kind = next(k for k in kind if isinstance(k, dict))
    return [f["name"] for f in kind["fields"]]


def _docs_text(*names: str) -> str:
    return "\n".join((DOCS / name).read_text() for name in names)


# Walk (a): a new event kind.


@pytest.mark.parametrize("cls", EVENT_TYPES, ids=lambda cls: cls.__name__)
def test_walk_a_every_event_kind_has_its_schema_and_its_doc(cls: type) -> None:
    schema = _schema(ROOT / "schemas" / f"{cls.__name__}.avsc")
    assert schema["name"] == cls.__name__
    fields = {f.name for f in dataclasses.fields(cls)}
    assert {f["name"] for f in schema["fields"]} == fields, "schema and class disagree"
    assert f"`{cls.__name__}`" in _docs_text("wire-format.md", "job-lifecycle.md")


def test_walk_a_the_replay_corpus_holds_every_event_kind() -> None:
    recorded = {
        event.kind
        for path in sorted((ROOT / "replay").glob("*.history.avro"))
        for event in read_history(path).events
    }
    missing = sorted({cls.__name__ for cls in EVENT_TYPES} - recorded)
    assert missing == [], f"record a history with {missing} (replay/README.md)"


# Walk (c): a change to a retry policy.


def test_walk_c_every_retry_field_reaches_the_wire_the_index_the_api_and_the_docs() -> None:
    fields = [f.name for f in dataclasses.fields(RetryPolicy)]
    assert _record_fields(_schema(ROOT / "schemas" / "JobEnqueued.avsc"), "retry") == fields
    assert _record_fields(_schema(ROOT / "projections" / "JobState.avsc"), "retry") == fields
    assert list(RetryRequest.model_fields) == fields  # the HTTP body
    assert list(Retry.model_fields) == fields  # the HTTP view
    section = _docs_text("job-lifecycle.md").split("## Retries and backoff", 1)[1].split("\n## ")[0]
    assert [f for f in fields if not re.search(rf"\b{f}\b", section)] == []


# Walk (d): a new limit kind.


# The limit settings a caller writes: what client.limits.limit_event returns.
SETTINGS = get_args(get_type_hints(limit_event)["return"])


def test_walk_d_the_limit_settings_are_limit_family_events() -> None:
    assert SETTINGS and set(SETTINGS) <= set(event_types(EventFamily.LIMIT))


@pytest.mark.parametrize("cls", SETTINGS, ids=lambda cls: cls.__name__)
def test_walk_d_every_limit_setting_has_its_callers_and_its_doc(cls: type) -> None:
    callers = {
        "client/limits.py": cls.__name__,  # builds it
        "api/limits.py": "limit_event",  # PUT /v1/queues/{queue}/limit, /v1/keys/{key}/limit
        "operator/commands/queues.py": "limit_event",  # evsched queues limit
        "core/permits.py": cls.__name__,  # its fold
        "core/bounds.py": cls.__name__,  # its bounds
    }
    for caller, name in callers.items():
        source = (ROOT / "src" / "evsched" / caller).read_text()
        assert re.search(rf"\b{name}\b", source), f"{caller} does not use {name}"
    assert f"`{cls.__name__}`" in _docs_text("job-lifecycle.md")


# Walks (b) and (e): every command and every route is documented.


def _commands(app: typer.Typer, prefix: str = "evsched") -> list[str]:
    found = [f"{prefix} {c.name}" for c in app.registered_commands if c.name]
    for group in app.registered_groups:
        assert group.name is not None and group.typer_instance is not None
        found += _commands(group.typer_instance, f"{prefix} {group.name}")
    return found


def test_walk_b_every_cli_command_is_in_the_docs() -> None:
    text = _docs_text("operator.md", "operations.md", "job-lifecycle.md", "dashboard.md")
    text += (ROOT / "README.md").read_text()
    commands = _commands(cli_app)
    assert "evsched schedules show" in commands and len(commands) > 30
    missing = [c for c in commands if c not in text]
    assert missing == []


def test_walk_e_every_http_route_is_in_the_docs(tmp_path: Path) -> None:
    text = _docs_text("operator.md", "job-lifecycle.md", "dashboard.md", "operations.md")
    replica = MemoryReplica(MemoryLog(), tmp_path, topic="docs.events")  # never read: no request
    app = create_app(Settings(namespace="docs", event_partitions=1), replica=replica)
    api = sorted(p for p in app.openapi()["paths"] if p.startswith("/v1/"))
    assert "/v1/queues" in api and len(api) > 15
    missing = [path for path in api if re.sub(r"\{[^}]+\}", "{", path) not in _braced(text)]
    assert missing == []


def _braced(text: str) -> str:
    """The docs with every ``{name}`` placeholder read as ``{``, so names may differ."""
    return re.sub(r"\{[^}]*\}", "{", text)
