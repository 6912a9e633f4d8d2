"""The dashboard's ``/live`` streams share one snapshot per tick, are capped, and a slow reader
holds one frame (issue 32: 300 anonymous streams built 300 snapshots a tick and slowed enqueues).

httpx's ASGITransport hands a response over only once it ended, so the streams here are driven
through the ASGI interface directly: each stays open, and its body arrives chunk by chunk.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI

from evsched.api.dashboard import overview
from evsched.api.dashboard.live import Live
from evsched.api.dashboard.stream import Fanout, StreamCaps, Subscriber
from tests.unit.api.test_api_twin import TOKEN, Harness

DEADLINE_S = 10.0


class Stream:
    """One ``GET /live`` held open: its status, headers and the overview events it received."""

    def __init__(self, api: FastAPI, headers: dict[str, str] | None = None) -> None:
        self.status: int | None = None
        self.headers: dict[str, str] = {}
        self.body = ""
        self.arrived = asyncio.Event()
        self._gone = asyncio.Event()
        scope = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": "1.1",
            "method": "GET",
            "scheme": "http",
            "path": "/live",
            "raw_path": b"/live",
            "root_path": "",
            "query_string": b"",
            "headers": [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()],
            "client": ("127.0.0.1", 50000),
            "server": ("api", 80),
        }
        self._asked = False
        self.task = asyncio.ensure_future(api(scope, self._receive, self._send))

    async def _receive(self) -> dict[str, Any]:
        if not self._asked:
            self._asked = True
            return {"type": "http.request", "body": b"", "more_body": False}
        await self._gone.wait()
        return {"type": "http.disconnect"}

    async def _send(self, message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
            self.headers = {k.decode(): v.decode() for k, v in message["headers"]}
        elif message["type"] == "http.response.body":
            self.body += message.get("body", b"").decode()
        self.arrived.set()

    @property
    def overviews(self) -> int:
        return self.body.count("event: overview\n")

    def disconnect(self) -> None:
        self._gone.set()


async def until(condition: Callable[[], bool], what: str) -> None:
    """Wait for ``condition`` (checked as the loop runs), failing after ``DEADLINE_S``."""
    async with asyncio.timeout(DEADLINE_S):
        while not condition():
            await asyncio.sleep(0.01)
    assert condition(), what


@pytest.fixture
async def board(tmp_path: Path) -> AsyncIterator[Harness]:
    async with Harness(tmp_path, token=TOKEN, live_streams=StreamCaps(total=3, anonymous=2)) as h:
        yield h
        h.api.state.evsched_dashboard.live.close()


async def close_all(live: Live, streams: list[Stream]) -> None:
    live.close()
    async with asyncio.timeout(DEADLINE_S):
        await asyncio.gather(*(s.task for s in streams))


async def test_open_streams_share_one_snapshot_per_tick(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    built = 0
    real = overview.totals

    def counted(ctx: Any) -> dict[str, int]:
        nonlocal built
        built += 1  # once per snapshot: every overview sums the partitions' tallies once
        return real(ctx)

    monkeypatch.setattr(overview, "totals", counted)
    async with Harness(tmp_path, live_streams=StreamCaps(total=50, anonymous=50)) as h:
        live = h.api.state.evsched_dashboard.live
        streams = [Stream(h.api) for _ in range(40)]
        await until(lambda: all(s.overviews == 1 for s in streams), "a first overview each")
        first = built
        for tick in (2, 3):
            live.observe_commit([])
            await until(lambda t=tick: all(s.overviews == t for s in streams), f"overview {tick}")
        await close_all(live, streams)
    assert {s.status for s in streams} == {200}
    assert (first, built) == (1, 3), "one snapshot a tick, whatever the number of streams"


async def test_streams_past_a_cap_get_a_503_with_retry_after(board: Harness) -> None:
    live = board.api.state.evsched_dashboard.live
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    anonymous = [Stream(board.api), Stream(board.api)]
    await until(lambda: all(s.overviews for s in anonymous), "two anonymous streams open")
    third = Stream(board.api)
    # Refused before the token holder's stream asks: else the two race for the last place.
    await asyncio.wait_for(third.task, DEADLINE_S)
    signed_in = Stream(board.api, bearer)
    await until(lambda: signed_in.overviews == 1, "a stream with a token past the anonymous cap")
    over_total = Stream(board.api, bearer)
    await asyncio.wait_for(over_total.task, DEADLINE_S)
    for refused in (third, over_total):
        assert refused.status == 503
        assert refused.headers["retry-after"] == "10"
        assert '"code":"too_many_streams"' in refused.body
    assert "without a token" in third.body
    assert "3 live streams are open" in over_total.body

    anonymous[0].disconnect()  # its place is given back: another anonymous stream opens
    await asyncio.wait_for(anonymous[0].task, DEADLINE_S)
    again = Stream(board.api)
    await until(lambda: again.overviews == 1, "an anonymous stream in the freed place")
    await close_all(live, [anonymous[1], signed_in, again])


async def test_without_auth_every_stream_counts_as_anonymous(tmp_path: Path) -> None:
    async with Harness(tmp_path, live_streams=StreamCaps(total=5, anonymous=1)) as h:
        first = Stream(h.api)
        await until(lambda: first.overviews == 1, "the first stream")
        second = Stream(h.api, {"Authorization": "Bearer anything-at-all-here"})
        await asyncio.wait_for(second.task, DEADLINE_S)
        assert second.status == 503
        await close_all(h.api.state.evsched_dashboard.live, [first])


async def test_a_reader_that_never_reads_holds_only_the_latest_frame() -> None:
    live = Live(dict)
    frames = iter(range(1, 1_000))

    async def build() -> str:
        return f"frame {next(frames)}"

    feed = Fanout(live, build, caps=StreamCaps(), min_interval_s=0)
    slow, fast = feed.join(anonymous=True), feed.join(anonymous=True)
    assert await fast.next(DEADLINE_S) == "frame 1"
    for tick in range(2, 7):
        live.observe_commit([])
        assert await fast.next(DEADLINE_S) == f"frame {tick}"
    assert feed.builds == 6
    # Five frames went by unread: the slow stream holds the last, and nothing else.
    assert await slow.next(0) == "frame 6"
    assert await slow.next(0) is None
    live.close()
    assert await fast.next(DEADLINE_S) is None
    assert fast.ended


async def test_a_failing_snapshot_ends_the_streams_instead_of_hanging_them() -> None:
    live = Live(dict)

    async def build() -> str:
        raise RuntimeError("index closed")

    feed = Fanout(live, build, caps=StreamCaps(), min_interval_s=0)
    subscriber: Subscriber = feed.join(anonymous=False)
    assert await subscriber.next(DEADLINE_S) is None
    assert subscriber.ended
    live.close()


def test_caps_refuse_more_anonymous_than_total() -> None:
    with pytest.raises(ValueError, match="anonymous <= total"):
        StreamCaps(total=1, anonymous=2)
