"""Every answer of the dashboard carries its security headers, the JSON API's ``nosniff``
(issue 32), and the pages load nothing their Content-Security-Policy forbids."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from fastapi.routing import APIRoute

from evsched.api.auth import Tokens
from evsched.api.dashboard import actions, pages
from tests.unit.api.test_api_twin import TOKEN, Harness
from tests.unit.api.test_dashboard import csrf_of, enqueue, kill, login, login_form

TEMPLATES = Path(__file__).resolve().parents[3] / "src/evsched/api/dashboard/templates"
# Exactly what the pages load (their own scripts, styles, images, stream and forms); no inline.
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
FRAMING = {
    "x-frame-options": "DENY",
    "content-security-policy": CONTENT_SECURITY_POLICY,
    "x-content-type-options": "nosniff",
    "referrer-policy": "same-origin",
}


@pytest.fixture
async def board(tmp_path: Path) -> AsyncIterator[Harness]:
    async with Harness(tmp_path, token=TOKEN) as harness:
        yield harness


def assert_dashboard_headers(response: httpx.Response, *, stored: bool = False) -> None:
    where = f"{response.request.method} {response.request.url.path} ({response.status_code})"
    for name, value in FRAMING.items():
        assert response.headers.get(name) == value, (where, name)
    if not stored:
        assert response.headers.get("cache-control") == "no-store", where


async def dashboard_answers(h: Harness) -> dict[tuple[str, str], httpx.Response]:
    """An answer of every dashboard route (keyed by method and route path), and of its edges."""
    job_id = await enqueue(h)
    dead = await enqueue(h)
    await kill(h, dead)
    schedule = {"cron": "0 3 * * *", "task": "t"}
    assert (await h.http.put("/v1/schedules/s1", json=schedule, headers=h.auth())).is_success
    seen: dict[tuple[str, str], httpx.Response] = {}
    seen["GET", "/login"] = await h.http.get("/login")
    seen["POST", "/login"] = await h.http.post("/login", data=await login_form(h, TOKEN))
    csrf = csrf_of((await h.http.get("/")).text)
    gets = {
        "/": "/",
        "/overview.json": "/overview.json",
        "/jobs": "/jobs",
        "/jobs/{job_id:path}": f"/jobs/{job_id}",
        "/dead-letters": "/dead-letters",
        "/schedules": "/schedules",
    }
    for route, path in gets.items():
        seen["GET", route] = await h.http.get(path)
    posts = {
        "/jobs/{job_id:path}/cancel": f"/jobs/{job_id}/cancel",
        "/jobs/{job_id:path}/requeue": f"/jobs/{dead}/requeue",
        "/dead-letters/requeue": "/dead-letters/requeue",
        "/schedules/{schedule_id:path}/pause": "/schedules/s1/pause",
        "/schedules/{schedule_id:path}/resume": "/schedules/s1/resume",
        "/schedules/{schedule_id:path}/delete": "/schedules/s1/delete",
    }
    for route, path in posts.items():
        seen["POST", route] = await h.http.post(path, data={"csrf": csrf})
    seen["POST", "/logout"] = await h.http.post("/logout", data={"csrf": csrf})
    h.api.state.evsched_dashboard.live.close()  # so the stream ends after its first line
    seen["GET", "/live"] = await h.http.get("/live")
    return seen


def dashboard_routes() -> set[tuple[str, str]]:
    """What ``dashboard.install`` mounts besides its static files."""
    return {
        (method, route.path)
        for router in (pages.router, actions.router)
        for route in router.routes
        if isinstance(route, APIRoute)
        for method in route.methods
    }


async def test_every_dashboard_route_answers_with_the_headers(board: Harness) -> None:
    await login(board)
    seen = await dashboard_answers(board)
    assert set(seen) == dashboard_routes()  # a new route must be added here
    for answer in seen.values():
        assert answer.status_code < 400, (answer.request.url, answer.text[:200])
        assert_dashboard_headers(answer)
    assert seen["GET", "/jobs/{job_id:path}"].headers["content-type"].startswith("text/html")
    assert seen["GET", "/live"].headers["content-type"].startswith("text/event-stream")


async def test_refusals_redirects_errors_and_assets_carry_them_too(tmp_path: Path) -> None:
    async with Harness(tmp_path, token=TOKEN) as h:
        edges = [
            await h.http.get("/jobs/no-such-job"),  # 404 page
            await h.http.get("/jobs", params={"limit": 0}),  # 422 from validation
            await h.http.post("/jobs/x/cancel", data={"csrf": "0"}),  # 403 refusal page
            await h.http.get("/no-such-page"),  # routing's 404
        ]
        assert [r.status_code for r in edges] == [404, 422, 403, 404]
        for answer in edges:
            assert_dashboard_headers(answer)
        for asset in ("dashboard.js", "dashboard.css", "chart.umd.min.js"):
            answer = await h.http.get(f"/static/{asset}")
            assert answer.status_code == 200
            assert_dashboard_headers(answer, stored=True)  # no job data: caches may keep it
    async with Harness(tmp_path / "guarded", tokens=Tokens(write=TOKEN, auth_reads=True)) as h:
        to_login = await h.http.get("/jobs")
        assert to_login.status_code == 303
        assert_dashboard_headers(to_login)


async def test_api_answers_are_nosniff_and_keep_their_own_framing(board: Harness) -> None:
    made = await board.http.post("/v1/jobs", json={"task": "t"}, headers=board.auth())
    answers = [
        made,
        await board.http.get(f"/v1/jobs/{made.json()['id']}"),
        await board.http.get("/v1/jobs/missing"),
        await board.http.post("/v1/jobs", json={"task": "t"}),  # 401
        await board.http.get("/healthz"),
        await board.http.get("/metrics"),
        await board.http.get("/openapi.json"),
    ]
    for answer in answers:
        assert answer.headers.get("x-content-type-options") == "nosniff", answer.request.url
    # Swagger UI loads its scripts from a CDN: the dashboard's policy would blank it.
    assert "content-security-policy" not in (await board.http.get("/docs")).headers


def test_the_pages_need_no_inline_code_or_style() -> None:
    """The policy has no 'unsafe-inline': no template may rely on it."""
    for template in TEMPLATES.glob("*.html"):
        text = template.read_text()
        assert not re.search(r"\sstyle=|\son[a-z]+=|javascript:|<style", text), template.name
        scripts = re.findall(r"<script([^>]*)>", text)
        for attributes in scripts:
            assert "src=" in attributes or 'type="application/json"' in attributes, template.name
