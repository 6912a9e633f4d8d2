"""The operations dashboard: server-rendered pages at ``/`` of the API, live by server-sent events.

``install`` mounts it on an API app: same process, same replica, same tokens, and every write
through the API's own routes.
"""

from __future__ import annotations

from functools import partial

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles

from evsched.api.context import ApiContext
from evsched.api.dashboard import actions, pages
from evsched.api.dashboard.board import HERE, Board, NeedsLogin, templates, to_login
from evsched.api.dashboard.live import Live
from evsched.api.dashboard.overview import BrokerFacts, depth, overview_frame
from evsched.api.dashboard.session import Sessions
from evsched.api.dashboard.stream import MIN_INTERVAL_S, Fanout, StreamCaps

__all__ = ["Board", "StreamCaps", "install"]


def install(api: FastAPI, ctx: ApiContext, caps: StreamCaps | None = None) -> Board:
    """Mount the dashboard's pages and assets on ``api``; the caller hooks ``board.live``.

    ``caps`` bound the ``/live`` streams open at once (default: ``StreamCaps()``).
    """
    live, facts = Live(lambda: depth(ctx)), BrokerFacts()
    feed = Fanout(
        live,
        partial(overview_frame, ctx, live, facts),
        caps=caps or StreamCaps(),
        min_interval_s=MIN_INTERVAL_S,
    )
    board = Board(
        live=live,
        facts=facts,
        feed=feed,
        sessions=Sessions(ctx.tokens),
        templates=templates(),
    )
    for name in board.templates.env.list_templates():
        board.templates.env.get_template(name)  # compiled now, not on the first page view
    api.state.evsched_dashboard = board
    api.add_exception_handler(NeedsLogin, to_login)
    api.include_router(pages.router)
    api.include_router(actions.router)
    api.mount("/static", StaticFiles(directory=HERE / "static"), name="dashboard-static")
    return board
