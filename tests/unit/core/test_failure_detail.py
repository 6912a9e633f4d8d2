"""Failure detail outside the fold: the audit shows each failed attempt's traceback and category,
the job and dead-letter tables show the category, reruns read as such, and the
``evsched_failures`` metric counts failures by category with a bounded label set."""

from __future__ import annotations

import io
from pathlib import Path

from rich.console import Console

from evsched.core import events as ev
from evsched.core.fold import fold
from evsched.core.state import FoldedEvent, JobState
from evsched.metrics import MAX_APP_CATEGORIES, CategoryLabels, Metrics
from evsched.operator.audit import audit
from evsched.operator.render import audit_json, jobs_table, print_audit
from tests.unit.operator.test_operator_audit import Story, _meta, enq, lease, ok, start


def failed(job: str, token: int, **detail: str) -> ev.AttemptFailed:
    return ev.AttemptFailed(
        **_meta(job, "worker-3"),
        token=token,
        error_type="KeyError",
        message="'sku'",
        retryable=False,
        **detail,  # type: ignore[arg-type]
    )


def test_the_audit_shows_each_failed_attempts_traceback_and_category(tmp_path: Path) -> None:
    story = Story()
    story.add(enq("job", max_attempts=1))
    story.add(lease("job", 1, 1))
    story.add(start("job", 1))
    story.add(failed("job", 1, category="billing_api", traceback="Traceback: line 7\nKeyError"))
    index = story.index(tmp_path / "p0000")
    found = audit(index, "job")
    index.close()
    assert found is not None
    row = found.rows[3]
    assert "[billing_api]; traceback kept" in row.reading
    assert row.traceback == "Traceback: line 7\nKeyError"
    document = audit_json(found)
    assert document["events"][3]["traceback"] == "Traceback: line 7\nKeyError"
    for width in (200, 80):
        console = Console(file=io.StringIO(), width=width)
        print_audit(console, found)
        text = console.file.getvalue()  # type: ignore[attr-defined]
        assert "traceback of AttemptFailed at 0@3:" in text and "Traceback: line 7" in text


def test_a_rerun_reads_as_one_in_the_audit(tmp_path: Path) -> None:
    story = Story()
    story.add(enq("job"))
    story.add(lease("job", 1, 1))
    story.add(start("job", 1))
    story.add(ok("job", 1))
    story.add(ev.JobRequeued(**_meta("job", "client"), rerun=True, reason="again"))
    index = story.index(tmp_path / "p0000")
    found = audit(index, "job")
    index.close()
    assert found is not None
    assert found.rows[4].reading.startswith("requeued from succeeded by client to run again")


def running() -> JobState:
    state = None
    for n, event in enumerate([enq("d", max_attempts=1), lease("d", 1, 1), start("d", 1)]):
        state, _ = fold(state, event, ev.Position(partition=0, offset=n, log_at=1_000 + n))
    assert state is not None
    return state


def dead(category: str | None) -> JobState:
    detail = {} if category is None else {"category": category}
    state, _ = fold(running(), failed("d", 1, **detail), _at())
    assert state is not None
    return state


def test_the_dead_letter_table_has_the_category_column() -> None:
    console = Console(file=io.StringIO(), width=250)
    console.print(jobs_table([dead("billing_api"), dead(None)], categories=True))
    text = console.file.getvalue()  # type: ignore[attr-defined]
    assert "category" in text and "billing_api" in text and "permanent" in text


def test_failures_are_counted_by_category_with_a_bounded_label_set() -> None:
    metrics = Metrics()
    before = running()
    after, entry = fold(before, failed("d", 1, category="billing_api"), _at())
    metrics.observe_commit([FoldedEvent(entry, before, after)])
    sample = metrics.registry.get_sample_value(
        "evsched_failures_total", {"queue": "default", "category": "billing_api"}
    )
    assert sample == 1.0
    labels = CategoryLabels()
    names = [labels.label(f"app_{i}") for i in range(MAX_APP_CATEGORIES + 5)]
    assert names[-1] == "other" and len(set(names)) == MAX_APP_CATEGORIES + 1
    assert labels.label("timeout") == "timeout"
    assert labels.label("app_0") == "app_0"


def _at() -> ev.Position:
    return ev.Position(partition=0, offset=9, log_at=2_000)
