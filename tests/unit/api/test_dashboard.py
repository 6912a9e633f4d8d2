"""The dashboard over the API's in-memory twin: pages render real state, writes need the token and
a CSRF token, and go through the API's own write path."""

from __future__ import annotations

import hashlib
import re
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from evsched.api.auth import Tokens
from evsched.api.dashboard import pages
from evsched.api.dashboard.session import COOKIE, Role, Sessions
from evsched.core import tallies
from evsched.core.events import AttemptFailed, AttemptStarted, JobCancelled, JobLeased
from tests.unit.api.test_api_twin import TOKEN, Harness

STATIC = Path(__file__).resolve().parents[3] / "src/evsched/api/dashboard/static"
READ_TOKEN = "read-only-token-for-tests"


@pytest.fixture
async def board(tmp_path: Path) -> AsyncIterator[Harness]:
    async with Harness(tmp_path, token=TOKEN) as harness:
        yield harness


def csrf_of(html: str) -> str:
    found = re.search(r'name="csrf" value="([0-9a-f]+)"', html)
    assert found, "no CSRF field on the page"
    return found.group(1)


async def login_form(h: Harness, token: str) -> dict[str, str]:
    """The login form's fields, filled in: fetching the form sets its nonce cookie."""
    form = await h.http.get("/login")
    assert form.status_code == 200
    return {"token": token, "next": "/jobs", "csrf": csrf_of(form.text)}


async def login(h: Harness, token: str = TOKEN) -> None:
    response = await h.http.post("/login", data=await login_form(h, token))
    assert response.status_code == 303
    assert response.headers["location"] == "/jobs"
    cookie = response.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and TOKEN not in cookie


async def enqueue(h: Harness, **body: object) -> str:
    response = await h.http.post("/v1/jobs", json={"task": "t", **body}, headers=h.auth())
    assert response.status_code == 201, response.text
    job_id: str = response.json()["id"]
    return job_id


async def kill(h: Harness, job_id: str) -> None:
    """Lease, start and fail the job permanently, as a node and a worker would."""
    now = h.replica.clock.now_ms()
    common = {"job_id": job_id, "emitted_at": now, "token": 1}
    await h.replica.append(
        JobLeased(event_id=f"l-{job_id}", source="node-n1", attempt=1, lease_ms=30_000, **common)
    )
    await h.replica.append(
        AttemptStarted(
            event_id=f"s-{job_id}", source="worker-w1", worker_id="w1", lease_ms=30_000, **common
        )
    )
    await h.replica.append(
        AttemptFailed(
            event_id=f"f-{job_id}",
            source="worker-w1",
            error_type="ValueError",
            message="bad input",
            retryable=False,
            traceback='Traceback (most recent call last):\n  File "app.py", line 3\nValueError',
            **common,
        )
    )
    h.replica.sync()


def cancel_event(job_id: str) -> JobCancelled:
    return JobCancelled(event_id=f"c-{job_id}", job_id=job_id, emitted_at=0, source="client-c")


def first_applied(h: Harness) -> int:
    return sum(1 for w in h.log.records if w.topic == h.replica.topic) - 1


async def test_overview_renders_the_counts_without_a_login_when_reads_are_open(
    board: Harness,
) -> None:
    await enqueue(board, queue="mail")
    page = await board.http.get("/")
    assert page.status_code == 200
    assert 'id="status-scheduled">1<' in page.text
    assert "/static/chart.umd.min.js" in page.text and "http" not in re.sub(
        r"https?://(api|www\.chartjs\.org)", "", page.text.split("<body")[0]
    )
    data = (await board.http.get("/overview.json")).json()
    assert data["statuses"]["scheduled"] == 1 and data["queues"]["mail"]["scheduled"] == 1
    assert data["totals"] == dict.fromkeys(tallies.NAMES, 0)
    assert "Totals since the namespace began" in page.text


async def test_the_totals_are_the_indexes_and_outlive_the_api(tmp_path: Path) -> None:
    async with Harness(tmp_path, token=TOKEN) as first:
        job_id = await enqueue(first)
        await kill(first, job_id)
        await first.replica.append(cancel_event(await enqueue(first)))
        first.replica.sync()
        before = (await first.http.get("/overview.json")).json()["totals"]
        assert (before["dead_letters"], before["cancelled"], before["retries"]) == (1, 1, 0)
        assert 'id="total-dead_letters">1<' in (await first.http.get("/")).text
    # A new API over the kept data dir: nothing left to fold, the totals are already there.
    second = Harness(tmp_path, token=TOKEN)
    second.log = second.replica.log = first.log
    async with second:
        assert second.replica.index(0).applied_offset() == first_applied(first)
        assert (await second.http.get("/overview.json")).json()["totals"] == before


async def test_a_job_page_shows_state_timeline_and_an_earlier_state(board: Harness) -> None:
    job_id = await enqueue(board, args=[1, "two"])
    await kill(board, job_id)
    now = await board.http.get(f"/jobs/{job_id}")
    assert now.status_code == 200
    assert 'id="state-status" class="status-dead">dead<' in now.text
    assert "ValueError (permanent): bad input" in now.text
    assert now.text.count('<tr class="verdict-') == 4
    first = board.replica.index(0).timeline(job_id)[0].offset
    earlier = await board.http.get(f"/jobs/{job_id}", params={"as_of": first})
    assert f"State as of offset {first}" in earlier.text
    assert 'id="state-status" class="status-scheduled">scheduled<' in earlier.text
    chart = re.search(r'id="timeline-data">(.*?)</script>', now.text, re.S)
    assert chart and '"token 1"' in chart.group(1) and '"AttemptFailed"' in chart.group(1)


async def test_a_job_page_lists_only_its_newest_events(
    board: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pages, "TIMELINE_SHOWN", 2)
    job_id = await enqueue(board)
    await kill(board, job_id)
    page = await board.http.get(f"/jobs/{job_id}")
    assert page.text.count('<tr class="verdict-') == 2
    assert "The newest 2 events; 2 earlier ones" in page.text


async def test_a_refused_write_is_marked_on_the_timeline(board: Harness) -> None:
    job_id = await enqueue(board)
    await kill(board, job_id)
    await board.replica.append(
        AttemptStarted(
            event_id="late",
            job_id=job_id,
            emitted_at=1,
            source="worker-w2",
            token=1,
            worker_id="w2",
            lease_ms=1_000,
        )
    )
    board.replica.sync()
    page = await board.http.get(f"/jobs/{job_id}")
    assert re.search(r'<tr class="verdict-(stale|rejected)">', page.text)


async def test_writes_need_a_login_and_the_csrf_token(board: Harness) -> None:
    job_id = await enqueue(board)
    await kill(board, job_id)
    page = await board.http.get(f"/jobs/{job_id}")
    assert "/requeue" not in page.text  # no write controls without a write session
    anonymous = await board.http.post(f"/jobs/{job_id}/requeue", data={"csrf": csrf_of(page.text)})
    assert anonymous.status_code == 403
    await login(board)
    page = await board.http.get(f"/jobs/{job_id}")
    forged = await board.http.post(f"/jobs/{job_id}/requeue", data={"csrf": "0" * 64})
    assert forged.status_code == 403
    done = await board.http.post(f"/jobs/{job_id}/requeue", data={"csrf": csrf_of(page.text)})
    assert done.status_code == 303 and "requeue%3A%20done" in done.headers["location"]
    kinds = [e.kind for e in board.replica.index(0).timeline(job_id)]
    assert kinds[-1] == "JobRequeued"
    sources = [e.source for e in board.replica.index(0).timeline(job_id)]
    assert sources[-1] == "api"  # the API's own write path


async def test_a_login_without_the_forms_csrf_pair_is_refused(board: Harness) -> None:
    # Another site posting the write token: no nonce cookie, so no session is set.
    forged = await board.http.post("/login", data={"token": TOKEN, "csrf": "0" * 64})
    assert forged.status_code == 403 and "stale" in forged.text
    assert COOKIE not in forged.headers.get("set-cookie", "")
    fields = await login_form(board, TOKEN)
    board.http.cookies.clear()  # the form's token without the cookie it pairs with
    refused = await board.http.post("/login", data=fields)
    assert refused.status_code == 403
    fields = await login_form(board, TOKEN)
    accepted = await board.http.post("/login", data=fields)
    assert accepted.status_code == 303 and COOKIE in accepted.headers["set-cookie"]


async def test_a_read_session_cannot_write(tmp_path: Path) -> None:
    async with Harness(tmp_path, tokens=Tokens(write=TOKEN, read=READ_TOKEN)) as h:
        job_id = await enqueue(h)
        assert (await h.http.get("/")).status_code == 303  # guarded reads: to the login form
        assert (await h.http.post("/login", data=await login_form(h, "nope"))).status_code == 401
        await login(h, READ_TOKEN)
        page = await h.http.get(f"/jobs/{job_id}")
        assert page.status_code == 200
        refused = await h.http.post(f"/jobs/{job_id}/cancel", data={"csrf": csrf_of(page.text)})
        assert refused.status_code == 403 and "write token" in refused.text


async def test_dead_letters_grouped_requeued_after_a_dry_run(board: Harness) -> None:
    ids = [await enqueue(board, queue="mail") for _ in range(3)]
    for job_id in ids:
        await kill(board, job_id)
    await login(board)
    page = await board.http.get("/dead-letters")
    # Grouped by the failure's category and its type (an uncategorised permanent error).
    assert re.search(r"<td>t</td><td>permanent / ValueError</td><td><a [^>]*>3</a>", page.text)
    job_page = await board.http.get(f"/jobs/{ids[0]}")
    assert 'id="error-category">permanent<' in job_page.text
    assert 'id="traceback"' in job_page.text and "File &#34;app.py&#34;, line 3" in job_page.text
    category = "permanent / ValueError"
    data = {"csrf": csrf_of(page.text), "scope": "matching", "task": "t", "category": category}
    dry = await board.http.post("/dead-letters/requeue", data=data)
    assert dry.status_code == 200 and "3 dead jobs match" in dry.text
    assert all(board.replica.index(0).job(i).status.value == "dead" for i in ids)  # type: ignore[union-attr]
    done = await board.http.post("/dead-letters/requeue", data={**data, "confirm": "3"})
    assert "requeued%203%20of%203" in done.headers["location"]
    assert {board.replica.index(0).job(i).status.value for i in ids} == {"scheduled"}  # type: ignore[union-attr]
    assert "no dead job" in (await board.http.get("/dead-letters")).text


async def test_jobs_filter_and_find_by_idempotency_key(board: Harness) -> None:
    await enqueue(board, queue="mail", labels={"team": "a"})
    other = await enqueue(board, queue="q")
    response = await board.http.post(
        "/v1/jobs",
        json={"task": "t", "queue": "q1"},
        headers={**board.auth(), "Idempotency-Key": "k-1"},
    )
    keyed = response.json()["id"]
    listed = await board.http.get("/jobs", params={"queue": "q"})
    assert other in listed.text and keyed not in listed.text
    labelled = await board.http.get("/jobs", params={"label": "team=a"})
    assert labelled.text.count('<tr class="status-') == 1
    found = await board.http.get("/jobs", params={"find": "k-1", "find_queue": "q1"})
    assert found.status_code == 303 and found.headers["location"] == f"/jobs/{keyed}"
    paged = await board.http.get("/jobs", params={"limit": 1})
    assert 'id="next-page"' in paged.text


async def test_schedules_listed_paused_resumed_and_deleted(board: Harness) -> None:
    body = {"cron": "0 3 * * *", "task": "t"}
    assert (
        await board.http.put("/v1/schedules/nightly", json=body, headers=board.auth())
    ).status_code == 201
    await login(board)
    page = await board.http.get("/schedules")
    assert "<td>nightly</td>" in page.text and "0 3 * * *" in page.text
    assert '<td class="schedule-state">active</td>' in page.text
    paused = await board.http.post("/schedules/nightly/pause", data={"csrf": csrf_of(page.text)})
    assert paused.status_code == 303 and "pause%20nightly%3A%20done" in paused.headers["location"]
    page = await board.http.get("/schedules")
    assert '<td class="schedule-state">paused</td>' in page.text
    kinds = [
        e.kind
        for e in board.replica.index(board.replica.partition_of("nightly")).timeline(
            "nightly", schedule=True
        )
    ]
    assert kinds[-1] == "SchedulePaused"  # through the API's own write path, on the log
    resumed = await board.http.post("/schedules/nightly/resume", data={"csrf": csrf_of(page.text)})
    assert resumed.status_code == 303
    page = await board.http.get("/schedules")
    assert '<td class="schedule-state">active</td>' in page.text
    gone = await board.http.post("/schedules/nightly/delete", data={"csrf": csrf_of(page.text)})
    assert gone.status_code == 303
    assert "no schedule" in (await board.http.get("/schedules")).text


def test_session_cookies_are_signed_and_carry_the_role() -> None:
    sessions = Sessions(Tokens(write=TOKEN, read=READ_TOKEN))
    cookie = sessions.cookie(Role.READ)
    assert sessions.role(cookie) is Role.READ
    body, _ = cookie.rsplit(".", 1)
    assert sessions.role(body.replace("1.", "2.", 1) + "." + "0" * 64) is Role.NONE
    assert sessions.role(None, bearer=TOKEN) is Role.WRITE
    assert sessions.csrf(cookie) != sessions.csrf(sessions.cookie(Role.READ))
    assert COOKIE == "evsched_session"


def test_the_vendored_chart_library_is_the_recorded_one() -> None:
    recorded = re.search(
        r"sha256 of `chart.umd.min.js`: `([0-9a-f]{64})`", (STATIC / "VENDORED.md").read_text()
    )
    assert recorded
    assert hashlib.sha256((STATIC / "chart.umd.min.js").read_bytes()).hexdigest() == recorded.group(
        1
    )
