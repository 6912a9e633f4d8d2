"""``?as_of=`` on ``GET /v1/jobs`` and ``GET /v1/stats`` over the twins: answers from the index
folded to the cut, a 202 while it is built, and a 422 naming ``as_of`` for a point that is not
one. The real build (``evsched rebuild --until`` on the broker):
``tests/integration/test_as_of.py``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from evsched.adapters.clock import now_ms
from evsched.adapters.kafka.log_cut import AtTime
from tests.unit.api.test_api_twin import TOKEN, Harness

AUTH = {"Authorization": f"Bearer {TOKEN}"}


async def _enqueue(h: Harness, queue: str, n: int) -> list[str]:
    ids = []
    for i in range(n):
        response = await h.http.post(
            "/v1/jobs", json={"task": "t.x", "queue": queue, "args": [i]}, headers=AUTH
        )
        assert response.status_code == 201, response.text
        ids.append(response.json()["id"])
    return ids


async def test_jobs_and_stats_as_of_an_offset_show_only_what_was_folded_then(
    tmp_path: Path,
) -> None:
    async with Harness(tmp_path, token=TOKEN) as h:
        first = await _enqueue(h, "q1", 3)
        cut = (await h.http.get("/v1/stats")).json()["partitions"][0]["applied_offset"]
        later = await _enqueue(h, "q2", 2)
        cancelled = await h.http.post(f"/v1/jobs/{first[0]}/cancel", headers=AUTH)
        assert cancelled.status_code == 200, cancelled.text

        now = (await h.http.get("/v1/jobs")).json()
        assert {j["id"] for j in now["jobs"]} == {*first, *later} and now["as_of"] is None
        response = await h.http.get("/v1/jobs", params={"as_of": f"0:{cut}"})
        assert response.status_code == 200, response.text
        past = response.json()
        assert {j["id"] for j in past["jobs"]} == set(first)
        assert {j["status"] for j in past["jobs"]} == {"scheduled"}  # the cancel came after
        assert past["as_of"] == {"requested": f"0:{cut}", "offsets": {"0": cut}}

        stats = (await h.http.get("/v1/stats", params={"as_of": str(cut)})).json()
        assert stats["total"] == 3 and set(stats["by_queue"]) == {"q1"}
        assert stats["by_status"]["scheduled"] == 3 and stats["by_status"]["cancelled"] == 0
        assert stats["partitions"] == [{"partition": 0, "applied_offset": cut}]
        assert stats["as_of"]["offsets"] == {"0": cut}
        current = (await h.http.get("/v1/stats")).json()
        assert current["total"] == 5 and current["by_status"]["cancelled"] == 1

        # Filters and cursors page through the past index as through the live one.
        page = (await h.http.get("/v1/jobs", params={"as_of": str(cut), "limit": 2})).json()
        rest = await h.http.get(
            "/v1/jobs", params={"as_of": str(cut), "cursor": page["next_cursor"]}
        )
        assert {j["id"] for j in page["jobs"] + rest.json()["jobs"]} == set(first)
        none = (await h.http.get("/v1/jobs", params={"as_of": "-1"})).json()
        assert none["jobs"] == [] and none["as_of"]["offsets"] == {"0": -1}


async def test_a_time_before_every_record_folds_nothing(tmp_path: Path) -> None:
    async with Harness(tmp_path, token=TOKEN) as h:
        h.log.log_at = now_ms()
        await _enqueue(h, "q1", 2)
        before = str(AtTime(h.log.log_at - 1))
        stats = (await h.http.get("/v1/stats", params={"as_of": before})).json()
        assert stats["total"] == 0 and stats["as_of"]["offsets"] == {"0": -1}
        at = (await h.http.get("/v1/stats", params={"as_of": str(AtTime(h.log.log_at))})).json()
        assert at["total"] == 2


async def test_an_index_being_built_answers_202_with_retry_after(tmp_path: Path) -> None:
    async with Harness(tmp_path, token=TOKEN) as h:
        await _enqueue(h, "q1", 1)
        h.past.building = True
        for path in ("/v1/jobs", "/v1/stats"):
            response = await h.http.get(path, params={"as_of": "0"})
            assert response.status_code == 202, response.text
            assert response.headers["Retry-After"] == "2"
            body: dict[str, Any] = response.json()
            assert body["status"] == "building"
            assert body["as_of"] == {"requested": "0", "offsets": {"0": 0}}


async def test_a_point_that_is_none_is_a_422_naming_as_of(tmp_path: Path) -> None:
    async with Harness(tmp_path, token=TOKEN) as h:
        await _enqueue(h, "q1", 1)
        future = str(AtTime(now_ms() + 60_000))
        for as_of, says in [
            ("last tuesday", "neither an RFC 3339 time"),
            ("2026-01-01T00:00:00", "no time zone"),
            (future, "in the future"),
            ("5", "past its end"),
            ("0:0,1:0", "name every partition"),
            ("x" * 2_001, "2000"),
        ]:
            for path in ("/v1/jobs", "/v1/stats"):
                response = await h.http.get(path, params={"as_of": as_of})
                assert response.status_code == 422, (as_of, response.text)
                error = response.json()["error"]
                assert error["field"] == "as_of" or error["details"][0]["field"] == "as_of"
                assert says in response.text, response.text


async def test_the_dashboards_jobs_page_lists_the_jobs_as_of_a_point(tmp_path: Path) -> None:
    async with Harness(tmp_path, token=TOKEN) as h:
        first = await _enqueue(h, "q1", 2)
        cut = (await h.http.get("/v1/stats")).json()["partitions"][0]["applied_offset"]
        later = await _enqueue(h, "q2", 1)
        page = await h.http.get("/jobs", params={"as_of": str(cut), "limit": 1})
        assert page.status_code == 200, page.text
        assert 'id="as-of"' in page.text and f"0:{cut}" in page.text
        assert page.text.count('<tr class="status-') == 1 and later[0] not in page.text
        assert f"as_of={cut}&amp;cursor=" in page.text  # the next page is as of the same point
        rest = await h.http.get("/jobs", params={"as_of": str(cut)})
        assert all(job in rest.text for job in first) and later[0] not in rest.text
        now = await h.http.get("/jobs")
        assert 'id="as-of"' not in now.text and later[0] in now.text

        h.past.building = True
        building = await h.http.get("/jobs", params={"as_of": "0"})
        assert building.status_code == 202
        assert 'id="as-of-building"' in building.text and 'http-equiv="refresh"' in building.text
        refused = await h.http.get("/jobs", params={"as_of": "soon"})
        assert refused.status_code == 422 and refused.json()["error"]["field"] == "as_of"


async def test_the_jobs_filter_form_as_a_browser_submits_it(tmp_path: Path) -> None:
    """Every field of the form is sent, the empty ones as "" (status "any" included)."""
    async with Harness(tmp_path, token=TOKEN) as h:
        await _enqueue(h, "q1", 1)
        fields = ("status", "queue", "task", "label", "since", "until", "as_of")
        form = dict.fromkeys(fields, "")
        listed = await h.http.get("/jobs", params=form)
        assert listed.status_code == 200, listed.text
        assert listed.text.count('<tr class="status-') == 1
        bad = await h.http.get("/jobs", params={**form, "status": "finished"})
        assert bad.status_code == 422 and bad.json()["error"]["field"] == "status"


async def test_the_dashboards_overview_as_of_a_point_shows_the_counts_of_then(
    tmp_path: Path,
) -> None:
    async with Harness(tmp_path, token=TOKEN) as h:
        await _enqueue(h, "q1", 2)
        cut = (await h.http.get("/v1/stats")).json()["partitions"][0]["applied_offset"]
        await _enqueue(h, "q2", 3)
        live = await h.http.get("/")
        assert 'id="as-of-form"' in live.text and '<p class="big" id="total">5</p>' in live.text
        page = await h.http.get("/", params={"as_of": str(cut)})
        assert page.status_code == 200, page.text
        assert '<p class="big" id="total">2</p>' in page.text
        assert '<p class="big" id="status-scheduled">2</p>' in page.text
        assert f"0:{cut}" in page.text and ">q2<" not in page.text
        assert 'data-page="overview-as-of"' in page.text  # no live stream replaces the counts
        h.past.building = True
        building = await h.http.get("/", params={"as_of": "0"})
        assert building.status_code == 202 and 'id="as-of-building"' in building.text
