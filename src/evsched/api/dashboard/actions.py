"""The dashboard's writes: log in and out, cancel and requeue jobs, requeue dead letters in bulk,
delete schedules. Each write calls the API's own route function, so it is checked, written and
judged exactly as the same request to ``/v1`` would be.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from datetime import datetime
from typing import Annotated
from urllib.parse import quote

from fastapi import APIRouter, Form, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from evsched.api import controls as control_routes
from evsched.api import jobs as job_routes
from evsched.api import schedules as schedule_routes
from evsched.api.control_models import ControlRequest
from evsched.api.dashboard.board import View, Viewer, board_of, segment
from evsched.api.dashboard.live import DeadLetters
from evsched.api.dashboard.session import COOKIE, LOGIN_COOKIE, LOGIN_FORM_S, SESSION_S, Role
from evsched.api.errors import ApiError
from evsched.api.id_fields import JobId, ScheduleId
from evsched.api.models import CancelRequest, RequeueRequest
from evsched.api.writes import NotYetApplied
from evsched.core.ids import job_id_for_fire

router = APIRouter(include_in_schema=False)
BULK_AT_ONCE = 16  # writes in flight during a bulk requeue
MAX_BULK = 10_000
Csrf = Annotated[str | None, Form()]
REASON = "requeued from the dashboard"


def _back(path: str, message: str) -> RedirectResponse:
    return RedirectResponse(f"{path}?msg={quote(message)}", status_code=303)


def _allowed(view: Viewer, csrf: str | None) -> HTMLResponse | None:
    """A refusal page unless the viewer may write and the form's CSRF token is right."""
    if not view.board.sessions.csrf_ok(view.cookie, csrf):
        return view.page("refused.html", status_code=403, why="the form is stale: reload the page")
    if not view.can_write:
        return view.page("refused.html", status_code=403, why="writes need the write token")
    return None


async def _one(write: Awaitable[object]) -> str:
    """Run one API write; its outcome in words."""
    try:
        await write
    except ApiError as exc:
        return f"refused: {exc.message}"
    except NotYetApplied:
        return "written, not yet applied here"
    return "done"


@router.get("/login", response_class=HTMLResponse)
async def login_form(request: Request, next: str = "/") -> HTMLResponse:
    return _login_page(request, next, None, 200)


def _login_page(request: Request, next: str, error: str | None, status: int) -> HTMLResponse:
    """The login form, with a fresh nonce cookie and the CSRF token that pairs with it."""
    sessions = board_of(request).sessions
    nonce = sessions.login_nonce()
    context = {
        "viewer": None,
        "next": _local(next),
        "error": error,
        "login_csrf": sessions.login_csrf(nonce),
    }
    response = board_of(request).templates.TemplateResponse(
        request, "login.html", context, status_code=status
    )
    response.set_cookie(
        LOGIN_COOKIE,
        nonce,
        max_age=LOGIN_FORM_S,
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
        path="/login",
    )
    return response


@router.post("/login", response_model=None)
async def login(
    request: Request,
    token: Annotated[str, Form(max_length=4_096)],
    next: Annotated[str, Form()] = "/",
    csrf: Csrf = None,
) -> Response:
    board = board_of(request)
    if not board.sessions.login_csrf_ok(request.cookies.get(LOGIN_COOKIE), csrf):
        return _login_page(request, next, "the form is stale: log in again", 403)
    role = board.sessions.login(token.strip())
    if role is Role.NONE:
        return _login_page(request, next, "that token is not valid", 401)
    response = RedirectResponse(_local(next), status_code=303)
    response.set_cookie(
        COOKIE,
        board.sessions.cookie(role),
        max_age=SESSION_S,
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
        path="/",
    )
    return response


@router.post("/logout")
async def logout(view: View, csrf: Csrf = None) -> Response:
    if not view.board.sessions.csrf_ok(view.cookie, csrf):
        return view.page("refused.html", status_code=403, why="the form is stale: reload the page")
    view.board.sessions.revoke(view.cookie)  # a copy of the cookie must not outlive the logout
    response = RedirectResponse("/login", status_code=303)
    response.delete_cookie(COOKIE, path="/", httponly=True, samesite="strict")
    return response


def _local(target: str) -> str:
    """Only paths of this site are followed after a login (no open redirect)."""
    return target if target.startswith("/") and not target.startswith("//") else "/"


@router.post("/jobs/{job_id:path}/cancel", response_model=None)
async def cancel(view: View, job_id: JobId, csrf: Csrf = None) -> Response:
    if (refused := _allowed(view, csrf)) is not None:
        return refused
    request = CancelRequest(reason="cancelled from the dashboard")
    outcome = await _one(job_routes.cancel(view.ctx, job_id, request))
    return _back(f"/jobs/{segment(job_id)}", f"cancel: {outcome}")


@router.post("/jobs/{job_id:path}/requeue", response_model=None)
async def requeue(view: View, job_id: JobId, csrf: Csrf = None) -> Response:
    if (refused := _allowed(view, csrf)) is not None:
        return refused
    outcome = await _one(job_routes.requeue(view.ctx, job_id, RequeueRequest(reason=REASON)))
    return _back(f"/jobs/{segment(job_id)}", f"requeue: {outcome}")


@router.get("/dead-letters", response_class=HTMLResponse)
async def dead_letters(
    view: View, task: str | None = None, category: str | None = None
) -> HTMLResponse:
    letters = _letters(view)
    ids = letters.matching(task or None, category or None)
    rows = [(i, *letters.jobs[i]) for i in ids[:500]]
    return view.page(
        "dead.html",
        groups=letters.groups(),
        rows=rows,
        matching=len(ids),
        task=task or "",
        category=category or "",
    )


def _letters(view: Viewer) -> DeadLetters:
    letters = view.board.live.dead
    if not letters.seeded:
        # Once per process; the commit hook keeps it from here (no await in between).
        replica = view.ctx.replica
        letters.seed(
            lambda: (s for p in sorted(replica.projectors) for s in replica.index(p).jobs())
        )
    return letters


@router.post("/dead-letters/requeue", response_model=None)
async def requeue_dead(
    view: View,
    *,
    csrf: Csrf = None,
    ids: Annotated[list[str] | None, Form()] = None,
    task: Annotated[str, Form()] = "",
    category: Annotated[str, Form()] = "",
    scope: Annotated[str, Form()] = "selected",
    confirm: Annotated[int | None, Form()] = None,
) -> Response:
    """Requeue the selected dead jobs, or (after a dry run that counts them) all that match."""
    if (refused := _allowed(view, csrf)) is not None:
        return refused
    letters = _letters(view)
    if scope == "matching":
        chosen = letters.matching(task or None, category or None)
        if confirm is None:
            return view.page("confirm.html", count=len(chosen), task=task, category=category)
    else:
        chosen = [i for i in ids or [] if i in letters.jobs]
    outcomes = await _bulk(view, chosen[:MAX_BULK])
    done = sum(1 for o in outcomes if o == "done")
    return _back("/dead-letters", f"requeued {done} of {len(chosen)}")


async def _bulk(view: Viewer, ids: list[str]) -> list[str]:
    outcomes: list[str] = []
    body = RequeueRequest(reason=REASON)
    for start in range(0, len(ids), BULK_AT_ONCE):
        chunk = ids[start : start + BULK_AT_ONCE]
        outcomes += await asyncio.gather(
            *(_one(job_routes.requeue(view.ctx, i, body)) for i in chunk)
        )
    return outcomes


@router.get("/schedules", response_class=HTMLResponse)
async def schedules(view: View, cursor: str | None = None) -> HTMLResponse:
    listed = await schedule_routes.list_schedules(view.ctx, limit=100, cursor=cursor or None)
    rows = [(s, _next_job(s.id, s.next_fire_at), _paused(view, s.id)) for s in listed.schedules]
    return view.page("schedules.html", schedules=rows, next_cursor=listed.next_cursor)


def _paused(view: Viewer, schedule_id: str) -> bool:
    return control_routes.schedule_view(view.ctx, schedule_id).paused


def _next_job(schedule_id: str, next_fire_at: datetime | None) -> str | None:
    """The id the next slot's job will have (derived from schedule and fire time)."""
    if next_fire_at is None:
        return None
    return job_id_for_fire(schedule_id, int(next_fire_at.timestamp() * 1000))


@router.post("/schedules/{schedule_id:path}/pause", response_model=None)
async def pause_schedule(view: View, schedule_id: ScheduleId, csrf: Csrf = None) -> Response:
    return await _switch(view, schedule_id, csrf, pause=True)


@router.post("/schedules/{schedule_id:path}/resume", response_model=None)
async def resume_schedule(view: View, schedule_id: ScheduleId, csrf: Csrf = None) -> Response:
    return await _switch(view, schedule_id, csrf, pause=False)


async def _switch(view: Viewer, schedule_id: str, csrf: str | None, *, pause: bool) -> Response:
    """Pause or resume a schedule through the API's own route, so it is audited the same way."""
    if (refused := _allowed(view, csrf)) is not None:
        return refused
    verb, route = (
        ("pause", control_routes.pause_schedule)
        if pause
        else (
            "resume",
            control_routes.resume_schedule,
        )
    )
    request = ControlRequest(reason=f"{verb}d from the dashboard")
    outcome = await _one(route(view.ctx, schedule_id, request))
    return _back("/schedules", f"{verb} {schedule_id}: {outcome}")


@router.post("/schedules/{schedule_id:path}/delete", response_model=None)
async def delete_schedule(view: View, schedule_id: ScheduleId, csrf: Csrf = None) -> Response:
    if (refused := _allowed(view, csrf)) is not None:
        return refused
    outcome = await _one(schedule_routes.delete_schedule(view.ctx, schedule_id))
    return _back("/schedules", f"delete {schedule_id}: {outcome}")
