"""Security headers on every answer: ``nosniff`` everywhere, and on the dashboard's answers the
framing, content, referrer and cache policies a browser needs to keep its pages to themselves."""

from __future__ import annotations

from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

# The JSON API, its probes and its OpenAPI pages; every other path is the dashboard's.
API_PREFIXES = ("/v1/", "/healthz", "/readyz", "/metrics", "/openapi.json", "/docs", "/redoc")
STATIC_PREFIX = "/static/"
# What the pages load: their own scripts, styles and images, the live stream and their own forms
# (dashboard.js sets the timeline's height through the CSSOM, which style-src does not cover;
# Chart.js draws on a canvas and needs neither inline code nor eval).
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
EVERY_ANSWER = {"X-Content-Type-Options": "nosniff"}
DASHBOARD = {
    "X-Frame-Options": "DENY",
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    # same-origin, not no-referrer: that would also blank the Origin of the forms' own POSTs.
    "Referrer-Policy": "same-origin",
}
# Pages, their JSON and the live stream show jobs: no cache (browser's or proxy's) keeps them.
NOT_STORED = {"Cache-Control": "no-store"}


def headers_for(path: str) -> dict[str, str]:
    """The security headers of an answer to ``path``."""
    if path.startswith(API_PREFIXES):
        return EVERY_ANSWER
    if path.startswith(STATIC_PREFIX):
        return {**EVERY_ANSWER, **DASHBOARD}
    return {**EVERY_ANSWER, **DASHBOARD, **NOT_STORED}


class SecurityHeaders:
    """Sets ``headers_for(path)`` on every HTTP answer, whichever route or handler made it."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        wanted = headers_for(scope["path"])

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in wanted.items():
                    headers[name] = value
            await send(message)

        await self.app(scope, receive, send_with_headers)
