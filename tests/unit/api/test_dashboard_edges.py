"""The dashboard against hostile ids, replayed sessions and framing (issue 32): each action acts
on exactly the object shown, a logged-out cookie is dead, and every answer carries its headers."""

from __future__ import annotations

import html
import re
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from evsched.api.auth import Tokens
from evsched.api.dashboard import session
from evsched.api.dashboard.session import COOKIE, Role, Sessions
from evsched.core.events import JobTemplate, ScheduleUpserted
from tests.unit.api.test_api_twin import TOKEN, Harness, foreign_job
from tests.unit.api.test_dashboard import csrf_of, kill, login

# Ids a browser would cut, resolve or decode if they were put in a path as they are.
ODD_IDS = (
    "zz/../victim",
    "a%2Fb",
    "50%",
    "q?x=1#frag",
    "with space",
    "ünï/cødé 😀",
    "x/delete",
    "../../jobs",
)


@pytest.fixture
async def board(tmp_path: Path) -> AsyncIterator[Harness]:
    async with Harness(tmp_path, token=TOKEN) as harness:
        yield harness


def row_of(page: str, first_cell: str) -> str:
    """The table row whose first cell shows ``first_cell``."""
    for row in page.split("<tr>"):
        if row.startswith(f"<td>{html.escape(first_cell)}</td>"):
            return row
    raise AssertionError(f"no row for {first_cell!r}")


def actions_in(fragment: str) -> list[str]:
    return [html.unescape(a) for a in re.findall(r'action="([^"]*)"', fragment)]


async def schedule(h: Harness, schedule_id: str) -> None:
    """A schedule whose id its writer chose (the API cannot name one holding a ``/``)."""
    template = JobTemplate(task="t", queue="default", args=b'{"args":[],"kwargs":{}}')
    await h.replica.append(
        ScheduleUpserted(
            event_id=f"u-{schedule_id}",
            schedule_id=schedule_id,
            emitted_at=h.replica.clock.now_ms(),
            source="client-c",
            cron="0 3 * * *",
            timezone="UTC",
            template=template,
        )
    )
    h.replica.sync()


def live_schedules(h: Harness) -> set[str]:
    return {s.schedule_id for s in h.replica.index(0).schedules() if not s.deleted}


async def test_delete_acts_on_the_schedule_shown_not_the_one_its_id_resolves_to(
    board: Harness,
) -> None:
    await schedule(board, "victim")
    await schedule(board, "zz/../victim")
    await login(board)
    page = (await board.http.get("/schedules")).text
    delete = [a for a in actions_in(row_of(page, "zz/../victim")) if a.endswith("/delete")]
    assert len(delete) == 1
    # The client resolves the action URL as a browser does (".." segments included).
    gone = await board.http.post(delete[0], data={"csrf": csrf_of(page)})
    assert gone.status_code == 303, gone.text
    assert live_schedules(board) == {"victim"}


@pytest.mark.parametrize("schedule_id", ODD_IDS)
async def test_pause_resume_delete_take_the_whole_id(board: Harness, schedule_id: str) -> None:
    await schedule(board, "victim")
    await schedule(board, schedule_id)
    await login(board)
    for verb in ("pause", "resume", "delete"):
        page = (await board.http.get("/schedules")).text
        found = [a for a in actions_in(row_of(page, schedule_id)) if a.endswith(f"/{verb}")]
        done = await board.http.post(found[0], data={"csrf": csrf_of(page)})
        assert done.status_code == 303 and "done" in done.headers["location"], (verb, done.text)
    assert live_schedules(board) == {"victim"}
    kinds = [e.kind for e in board.replica.index(0).timeline(schedule_id, schedule=True)]
    assert kinds[-3:] == ["SchedulePaused", "ScheduleResumed", "ScheduleDeleted"]
    assert [e.kind for e in board.replica.index(0).timeline("victim", schedule=True)] == [
        "ScheduleUpserted"
    ]


def link_to(job_id: str, page: str) -> str:
    """The href of the page's link that shows ``job_id``."""
    for href, text in re.findall(r'<a href="(/jobs/[^"]*)">([^<]*)</a>', page):
        if html.unescape(text) == job_id:
            return html.unescape(href)
    raise AssertionError(f"no link to {job_id!r}")


def status_of(h: Harness, job_id: str) -> str:
    state = h.replica.index(0).job(job_id)
    assert state is not None
    return state.status.value


@pytest.mark.parametrize("job_id", ODD_IDS)
async def test_job_links_cancel_and_requeue_act_on_the_job_shown(
    board: Harness, job_id: str
) -> None:
    await foreign_job(board, "victim")
    await foreign_job(board, job_id)
    await login(board)
    page = await board.http.get(link_to(job_id, (await board.http.get("/jobs")).text))
    assert page.status_code == 200 and f"<code>{html.escape(job_id)}</code>" in page.text
    cancel = [a for a in actions_in(page.text) if a.endswith("/cancel")]
    cancelled = await board.http.post(cancel[0], data={"csrf": csrf_of(page.text)})
    assert "cancel%3A%20done" in cancelled.headers["location"]
    assert (status_of(board, job_id), status_of(board, "victim")) == ("cancelled", "scheduled")
    # Back on the same job's page, whose requeue acts on it again.
    page = await board.http.get(cancelled.headers["location"])
    assert f"<code>{html.escape(job_id)}</code>" in page.text
    requeue = [a for a in actions_in(page.text) if a.endswith("/requeue")]
    requeued = await board.http.post(requeue[0], data={"csrf": csrf_of(page.text)})
    assert "requeue%3A%20done" in requeued.headers["location"]
    assert (status_of(board, job_id), status_of(board, "victim")) == ("scheduled", "scheduled")


async def test_dead_letter_and_find_links_keep_the_id(board: Harness) -> None:
    job_id = "zz/../victim"
    await foreign_job(board, "victim")
    await foreign_job(board, job_id)
    await kill(board, job_id)
    link = link_to(job_id, (await board.http.get("/dead-letters")).text)
    assert f"<code>{html.escape(job_id)}</code>" in (await board.http.get(link)).text
    found = await board.http.get("/jobs", params={"find": job_id})
    assert found.headers["location"] == link


async def test_the_login_form_sends_back_to_the_page_asked_for(tmp_path: Path) -> None:
    async with Harness(tmp_path, tokens=Tokens(write=TOKEN, auth_reads=True)) as h:
        await foreign_job(h, "victim")
        await foreign_job(h, "zz/../victim")
        link = "/jobs/zz%2F..%2Fvictim"
        asked = await h.http.get(link)
        assert asked.status_code == 303
        form = await h.http.get(asked.headers["location"])
        fields = {"token": TOKEN, "next": next_of(form.text), "csrf": csrf_of(form.text)}
        assert (await h.http.post("/login", data=fields)).headers["location"] == link


def next_of(page: str) -> str:
    found = re.search(r'name="next" value="([^"]*)"', page)
    assert found
    return html.unescape(found.group(1))


@pytest.mark.parametrize("dots", [".", ".."])
async def test_an_id_of_dots_alone_reaches_no_other_object(board: Harness, dots: str) -> None:
    """A browser resolves a ``.`` or ``..`` segment even escaped (``%2e``): such an id's links
    and forms cannot reach it, and must not reach anything else either."""
    await schedule(board, "victim")
    await schedule(board, dots)
    await foreign_job(board, "victim")
    await foreign_job(board, dots)
    await login(board)
    page = (await board.http.get("/schedules")).text
    for action in actions_in(row_of(page, dots)):
        refused = await board.http.post(action, data={"csrf": csrf_of(page)})
        assert refused.status_code in {404, 405}, action
    for verb in ("cancel", "requeue"):
        refused = await board.http.post(f"/jobs/{dots}/{verb}", data={"csrf": csrf_of(page)})
        assert refused.status_code in {404, 405}
    assert live_schedules(board) == {"victim", dots}
    assert (status_of(board, dots), status_of(board, "victim")) == ("scheduled", "scheduled")


# --- finding 2: a logout ends the session on the server ------------------------------------------


async def test_a_copied_cookie_is_dead_after_the_logout(tmp_path: Path) -> None:
    async with Harness(tmp_path, tokens=Tokens(write=TOKEN, auth_reads=True)) as h:
        await foreign_job(h, "j1")
        await login(h)
        copied = h.http.cookies[COOKIE]
        page = await h.http.get("/jobs/j1")
        assert page.status_code == 200
        out = await h.http.post("/logout", data={"csrf": csrf_of(page.text)})
        assert out.status_code == 303 and out.headers["location"] == "/login"
        assert f'{COOKIE}=""' in out.headers["set-cookie"]  # the browser's copy is cleared too
        h.http.cookies.set(COOKIE, copied)  # replayed, e.g. from a stolen copy
        replayed = await h.http.get("/jobs/j1")
        assert replayed.status_code == 303 and replayed.headers["location"].startswith("/login")
        write = await h.http.post("/jobs/j1/cancel", data={"csrf": csrf_of(page.text)})
        assert write.status_code == 303 and write.headers["location"].startswith("/login")
        assert status_of(h, "j1") == "scheduled"


def test_revocations_are_bounded_and_never_forgotten(monkeypatch: pytest.MonkeyPatch) -> None:
    sessions = Sessions(Tokens(write=TOKEN), max_revoked=3)
    now = [1_000_000_000]
    monkeypatch.setattr(session, "now_ms", lambda: now[0])
    kept = sessions.cookie(Role.WRITE)
    out = [sessions.cookie(Role.WRITE) for _ in range(3)]
    for cookie in out:
        sessions.revoke(cookie)
    assert [sessions.role(c) for c in out] == [Role.NONE] * 3
    assert sessions.role(kept) is Role.WRITE
    # A fourth revocation while all three are live: every session ends, none is forgotten.
    sessions.revoke(kept)
    assert len(sessions.revoked) == 0
    assert {sessions.role(c) for c in [kept, *out]} == {Role.NONE}
    # Revocations of expired sessions make room instead.
    old = [sessions.cookie(Role.READ) for _ in range(3)]
    for cookie in old:
        sessions.revoke(cookie)
    now[0] += (session.SESSION_S + 1) * 1000
    fresh = sessions.cookie(Role.READ)
    live = sessions.cookie(Role.READ)
    sessions.revoke(fresh)
    assert len(sessions.revoked) == 1
    assert (sessions.role(fresh), sessions.role(live)) == (Role.NONE, Role.READ)
