"""A real stack for the browser tests (broker, node, two workers, the API) and headless Chromium.

Chromium comes from the OS packages (``apt-get install chromium``): Playwright's own browser
download is not used. Without it the tests skip, and fail under CI=true.
"""

from __future__ import annotations

import os
import shutil
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio

from evsched.adapters.kafka.topics import ensure_topics
from tests.conftest import unique_name
from tests.integration.engine import Proc, Stack, wait_for

TOKEN = "browser-test-write-token"
APP = "tests.browser.browser_app:app"
QUEUES = ["default", "bulk"]


def chromium_path() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        reason = "no chromium on PATH (apt-get install chromium)"
        if os.environ.get("CI", "").lower() in {"1", "true", "yes"}:
            pytest.fail(f"{reason}; CI=true: browser tests must run", pytrace=False)
        pytest.skip(reason)
    return found


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class DashStack(Stack):
    """A Stack whose processes run the browser tasks and know the API's write token."""

    def env(self) -> dict[str, str]:
        env = super().env()
        env["EVSCHED_API_TOKEN"] = TOKEN
        return env

    def start_worker(self, name: str = "worker-1", *args: str) -> Proc:
        return self._spawn(
            name, ["worker", "--app", APP, "--queues", ",".join(QUEUES), "--lease-s", "2", *args]
        )

    def start_api(self, port: int) -> Proc:
        data = str(self.tmp / "api")
        return self._spawn("api", ["api", "--app", APP, "--port", str(port), "--data-dir", data])


@dataclass
class Dash:
    """The running stack, its API's URL, an authenticated HTTP client and a folder for marks."""

    stack: DashStack
    url: str
    http: httpx.AsyncClient
    marks: Path
    shots: Path

    async def enqueue(self, task: str, *args: Any, queue: str | None = None) -> str:
        body: dict[str, Any] = {"task": task, "args": list(args)}
        if queue is not None:
            body["queue"] = queue
        response = await self.http.post("/v1/jobs", json=body)
        assert response.status_code == 201, response.text
        job_id: str = response.json()["id"]
        return job_id

    async def status(self, job_id: str) -> str:
        response = await self.http.get(f"/v1/jobs/{job_id}")
        return str(response.json()["status"]) if response.status_code == 200 else ""

    async def wait_status(self, job_id: str, status: str, timeout_s: float = 60) -> None:
        async def reached() -> bool:
            return await self.status(job_id) == status

        await wait_for(reached, what=f"job {job_id} {status}", timeout_s=timeout_s)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def dash(
    kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Dash]:
    namespace = unique_name("dash")
    await ensure_topics(kafka_bootstrap, namespace, event_partitions=3, queues=QUEUES)
    home = tmp_path_factory.mktemp("dash")
    stack = DashStack(kafka_bootstrap, namespace, home)
    port = free_port()
    stack.start_node("node-1", "--dispatch-timeout-s", "15")
    stack.start_worker("worker-1", "--concurrency", "8")
    stack.start_worker("worker-2", "--concurrency", "8")
    stack.start_api(port)
    url = f"http://127.0.0.1:{port}"
    headers = {"Authorization": f"Bearer {TOKEN}"}
    # uvicorn closes idle connections after 5 s: never reuse one that old.
    limits = httpx.Limits(keepalive_expiry=2)
    http = httpx.AsyncClient(base_url=url, headers=headers, timeout=30, limits=limits)
    marks, shots = home / "marks", home / "screenshots"
    marks.mkdir()
    shots.mkdir()
    try:

        async def ready() -> bool:
            try:
                return (await http.get("/readyz")).status_code == 200
            except httpx.TransportError:
                return False

        # Three processes start first: minutes on a loaded 2-core machine.
        await wait_for(ready, what="the API to be ready", timeout_s=300)
        yield Dash(stack=stack, url=url, http=http, marks=marks, shots=shots)
    finally:
        await http.aclose()
        await stack.close()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def browser() -> AsyncIterator[Any]:
    from playwright.async_api import async_playwright

    executable = chromium_path()
    async with async_playwright() as playwright:
        launched = await playwright.chromium.launch(
            executable_path=executable, args=["--no-sandbox"], headless=True
        )
        try:
            yield launched
        finally:
            await launched.close()


@pytest_asyncio.fixture(loop_scope="module")
async def page(browser: Any, dash: Dash) -> AsyncIterator[Any]:
    """A fresh browser context, logged in with the write token through the login form."""
    context = await browser.new_context(base_url=dash.url, viewport={"width": 1400, "height": 1000})
    opened = await context.new_page()
    opened.set_default_timeout(30_000)
    # Anything the pages' Content-Security-Policy blocks is a bug of the pages (or the policy).
    blocked: list[str] = []
    opened.on(
        "console",
        lambda m: blocked.append(m.text) if "Content Security Policy" in m.text else None,
    )
    await opened.goto("/login")
    await opened.fill("input[name=token]", TOKEN)
    await opened.click("button[type=submit]")
    await opened.wait_for_url(f"{dash.url}/")
    try:
        yield opened
    finally:
        await context.close()
    assert blocked == [], blocked
