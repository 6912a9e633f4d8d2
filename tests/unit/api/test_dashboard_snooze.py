"""A snoozed job on the dashboard and in the API: a badge, its snoozes, when it is due again."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from evsched.core.events import AttemptSnoozed, AttemptStarted, JobLeased
from tests.unit.api.test_api_twin import TOKEN, Harness
from tests.unit.api.test_dashboard import enqueue

BADGE = '<span id="state-snoozed" class="badge">snoozed</span>'


@pytest.fixture
async def board(tmp_path: Path) -> AsyncIterator[Harness]:
    async with Harness(tmp_path, token=TOKEN) as harness:
        yield harness


async def run(h: Harness, job_id: str, token: int, attempt: int) -> None:
    common = {"job_id": job_id, "emitted_at": 0, "token": token}
    await h.replica.append(
        JobLeased(
            event_id=f"l{token}", source="node-n1", attempt=attempt, lease_ms=30_000, **common
        )
    )
    await h.replica.append(
        AttemptStarted(
            event_id=f"s{token}", source="worker-w1", worker_id="w1", lease_ms=30_000, **common
        )
    )


async def test_a_snoozed_job_shows_its_badge_until_it_is_leased_again(board: Harness) -> None:
    job_id = await enqueue(board)
    await run(board, job_id, token=1, attempt=1)
    await board.replica.append(
        AttemptSnoozed(
            event_id="z1", job_id=job_id, emitted_at=0, source="worker-w1", token=1,
            delay_ms=0, max_snoozes=25, reason="upstream said 429",
        )
    )  # fmt: skip
    board.replica.sync()
    page = await board.http.get(f"/jobs/{job_id}")
    assert 'class="status-scheduled">scheduled ' + BADGE in page.text
    assert '<dd id="state-snoozes">1, due again ' in page.text
    assert "upstream said 429" in page.text  # the timeline's reason
    listing = await board.http.get("/jobs")
    assert '<td>scheduled <span class="badge">snoozed</span></td>' in listing.text
    body = (await board.http.get(f"/v1/jobs/{job_id}", headers=board.auth())).json()
    assert body["snoozes"] == 1 and body["snoozed_until"] is not None
    assert body["attempt"] == 0 and body["status"] == "scheduled"

    await run(board, job_id, token=2, attempt=1)  # due at once: the snooze is over
    board.replica.sync()
    page = await board.http.get(f"/jobs/{job_id}")
    assert 'class="status-running">running</dd>' in page.text and BADGE not in page.text
    assert '<dd id="state-snoozes">1</dd>' in page.text
    body = (await board.http.get(f"/v1/jobs/{job_id}", headers=board.auth())).json()
    assert (body["snoozes"], body["snoozed_until"], body["attempt"]) == (1, None, 1)
