"""What the dashboard's routes share: live counters, sessions, templates and the viewer's access."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import quote

from fastapi import Depends, Request
from fastapi.responses import HTMLResponse, RedirectResponse
from fastapi.templating import Jinja2Templates
from markupsafe import Markup

from evsched.api.context import ApiContext, context
from evsched.api.dashboard.live import Live
from evsched.api.dashboard.overview import BrokerFacts
from evsched.api.dashboard.session import COOKIE, Role, Sessions
from evsched.api.dashboard.stream import Fanout

HERE = Path(__file__).parent


def _when(ms: int | None) -> str:
    if ms is None:
        return "—"
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + "Z"


def _as_json(value: Any) -> Markup:
    """JSON safe inside a <script> element (no closing tag can be smuggled in)."""
    text = json.dumps(value, separators=(",", ":"))
    return Markup(text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026"))  # noqa: S704


def segment(value: str) -> str:
    """An id as one path segment: ``/``, ``%``, ``?``, ``#`` and the rest escaped, so a browser
    neither resolves a ``..`` inside it nor cuts it, and the route gets the whole id back."""
    return quote(value, safe="")


def templates() -> Jinja2Templates:
    found = Jinja2Templates(directory=HERE / "templates")
    found.env.filters["when"] = _when
    found.env.filters["as_json"] = _as_json
    found.env.filters["segment"] = segment
    return found


@dataclass(slots=True)
class Board:
    live: Live
    facts: BrokerFacts
    feed: Fanout
    sessions: Sessions
    templates: Jinja2Templates


class NeedsLogin(Exception):
    """The page needs a session: answered by a redirect to the login form."""


@dataclass(slots=True)
class Viewer:
    """One request's view of the dashboard: the API context, the board and the caller's role."""

    request: Request
    ctx: ApiContext
    board: Board
    role: Role
    cookie: str | None

    @property
    def can_write(self) -> bool:
        return self.role is Role.WRITE

    def page(self, template: str, status_code: int = 200, **values: Any) -> HTMLResponse:
        return self.board.templates.TemplateResponse(
            self.request,
            template,
            {
                "viewer": self,
                "csrf": self.board.sessions.csrf(self.cookie),
                "auth": self.board.sessions.auth,
                "message": self.request.query_params.get("msg"),
                **values,
            },
            status_code=status_code,
        )


def board_of(request: Request) -> Board:
    found = request.app.state.evsched_dashboard
    assert isinstance(found, Board)
    return found


def viewer(request: Request) -> Viewer:
    """The caller, who must be allowed to read (else: to the login form)."""
    board = board_of(request)
    cookie = request.cookies.get(COOKIE)
    scheme, _, bearer = request.headers.get("authorization", "").partition(" ")
    role = board.sessions.role(cookie, bearer if scheme.lower() == "bearer" else None)
    if not board.sessions.can_read(role):
        raise NeedsLogin
    return Viewer(request=request, ctx=context(request), board=board, role=role, cookie=cookie)


View = Annotated[Viewer, Depends(viewer)]


async def to_login(request: Request, _: Exception) -> RedirectResponse:
    # The path as the browser sent it: decoded, an escaped id's ``/`` would come back as one.
    raw = request.scope.get("raw_path")
    path = raw.decode("latin-1") if raw else quote(request.url.path)
    target = path + (f"?{request.url.query}" if request.url.query else "")
    return RedirectResponse(f"/login?next={quote(target)}", status_code=303)
