"""docs/job-lifecycle.md stays in step with the Status and Verdict enums, event kinds and fold."""

from __future__ import annotations

import hashlib
import math
import re
from pathlib import Path

from evsched.core import retry
from evsched.core.events import EVENT_TYPES, JOB_EVENT_TYPES, RetryPolicy
from evsched.core.state import Status, Verdict
from tests.unit.core.test_fold_table import TABLE

DOC = Path(__file__).resolve().parents[3] / "docs" / "job-lifecycle.md"
TEXT = DOC.read_text(encoding="utf-8")
EDGE = re.compile(r"^\s*(\[\*\]|\w+) --> (\[\*\]|\w+)(?::\s*(\w+))?", re.MULTILINE)


def _diagram() -> str:
    match = re.search(r"```mermaid\n(stateDiagram-v2\n.*?)```", TEXT, re.DOTALL)
    assert match, "the page has a mermaid stateDiagram-v2 block"
    return match.group(1)


def _edges() -> set[tuple[str, str, str | None]]:
    return {(a, b, kind) for a, b, kind in EDGE.findall(_diagram())}


def test_every_status_verdict_and_event_kind_is_documented() -> None:
    for name in [*Status, *Verdict]:
        assert f"`{name}`" in TEXT, name
    for kind in EVENT_TYPES:
        assert f"`{kind.__name__}`" in TEXT, kind.__name__


def test_every_verdict_has_a_row_in_the_verdict_table() -> None:
    rows = set(re.findall(r"^\| `(\w+)` \|", TEXT, re.MULTILINE))
    assert {verdict.value for verdict in Verdict} <= rows
    assert {status.value for status in Status} <= rows


def test_the_diagram_has_every_status_and_only_real_statuses_and_kinds() -> None:
    edges = _edges()
    states = {a for a, _, _ in edges} | {b for _, b, _ in edges}
    assert states == {"[*]", *Status}
    kinds = {kind for _, _, kind in edges if kind}
    assert kinds == {kind.__name__ for kind in JOB_EVENT_TYPES}


def test_every_applied_transition_of_the_fold_table_is_drawn() -> None:
    drawn = {(a, b, kind) for a, b, kind in _edges()}
    for (before, kind, _variant), (verdict, after) in TABLE.items():
        if verdict is not Verdict.APPLIED:
            continue
        source = "[*]" if before is None else before.value
        assert after is not None
        assert (source, after.value, kind) in drawn, (source, after.value, kind)


def _derivation_example() -> tuple[str, int, str, int]:
    """(job id, attempt, hash hex, backoff ms) of the worked example after the derivation."""
    after = TEXT.split("<!-- backoff-derivation -->", 1)[1]
    found = re.search(
        r"job id `([^`]+)` and \*n\* = (\d+): `h` =\s+`([0-9a-f]{16})`"
        r".*?backoff is \*\*(\d+) ms\*\*",
        after,
        re.DOTALL,
    )
    assert found, "the backoff derivation has a worked example"
    job_id, n, digest, backoff = found.groups()
    return job_id, int(n), digest, int(backoff)


def _backoff_from_the_doc(policy: RetryPolicy, job_id: str, n: int) -> int:
    """The derivation exactly as docs/job-lifecycle.md writes it, without evsched's code."""
    cap = max(0, policy.max_backoff_ms)
    delay = float(max(0, policy.initial_backoff_ms))
    m = max(1.0, policy.multiplier)
    for _ in range(max(0, n - 1)):
        if delay >= cap:
            break
        delay = delay * m
    delay = min(delay, float(cap))
    j = min(1.0, max(0.0, policy.jitter))
    h = hashlib.blake2b(job_id.encode() + b"\x00" + str(n).encode(), digest_size=8).digest()
    u = float(int.from_bytes(h, "big")) * 2.0**-64
    return math.trunc(delay * (1.0 - (j * u)))


def test_the_documented_backoff_derivation_recomputes_the_fold() -> None:
    """Issue 9 E.17: an independent checker can recompute every backoff from the page."""
    job_id, n, digest, backoff = _derivation_example()
    h = hashlib.blake2b(job_id.encode() + b"\x00" + str(n).encode(), digest_size=8).hexdigest()
    assert h == digest
    assert _backoff_from_the_doc(RetryPolicy(), job_id, n) == backoff
    assert retry.backoff_ms(RetryPolicy(), job_id, n) == backoff
    policies = [RetryPolicy(), RetryPolicy(initial_backoff_ms=7, multiplier=1.5, jitter=1.0)]
    for policy in policies:
        for n in range(1, 40):
            for job in ("a", "é-job", "x" * 300):
                assert _backoff_from_the_doc(policy, job, n) == retry.backoff_ms(policy, job, n)
