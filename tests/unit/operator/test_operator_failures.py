"""The operator's side of failure detail and reruns, offline: ``dlq list`` shows and filters by
category; ``requeue --rerun`` builds a rerun."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer

from evsched.core.events import JobRequeued
from evsched.operator.writes import requeue_event
from tests.unit.core.test_failure_detail import failed
from tests.unit.operator.test_operator_audit import Story, enq, lease, start
from tests.unit.operator.test_operator_cli import invoke


@pytest.fixture
def dead_dir(tmp_path: Path) -> Path:
    story = Story()
    for job, category in (("a", "billing_api"), ("b", None)):
        story.add(enq(job, max_attempts=1))
        story.add(lease(job, 1, 1))
        story.add(start(job, 1))
        story.add(failed(job, 1, **({} if category is None else {"category": category})))
    story.index(tmp_path / "replica" / "p0000").close()
    return tmp_path / "replica"


def test_dlq_list_shows_and_filters_by_category(cli: typer.Typer, dead_dir: Path) -> None:
    offline = ["--offline", "--data-dir", str(dead_dir)]
    code, output = invoke(cli, "dlq", "list", *offline, "--json")
    assert code == 0
    assert {j["job_id"]: j["category"] for j in json.loads(output)} == {
        "a": "billing_api",
        "b": "permanent",
    }
    code, output = invoke(cli, "dlq", "list", *offline, "--category", "billing_api", "--json")
    assert [j["job_id"] for j in json.loads(output)] == ["a"]


def test_requeue_rerun_builds_an_explicit_rerun() -> None:
    event = requeue_event("job-1", "again", None, None, rerun=True)
    assert isinstance(event, JobRequeued) and event.rerun
    assert not requeue_event("job-1", "", None, None).rerun  # type: ignore[union-attr]
