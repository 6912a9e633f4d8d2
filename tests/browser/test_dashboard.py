"""The dashboard in headless Chromium against a real stack: real data on every page, live updates,
time travel, requeue from the dead letters, and 500 jobs through a worker's SIGKILL.

One stack and one browser serve the whole module (see conftest.py); each test uses jobs of its
own and waits on what the page shows, with deadlines.
"""

from __future__ import annotations

import asyncio
import re
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from playwright.async_api import expect

from evsched.adapters.clock import now_ms
from evsched.adapters.kafka.log_cut import AtTime
from evsched.adapters.kafka.topics import partition_count
from tests.browser.conftest import Dash
from tests.integration.engine import wait_for

pytestmark = [
    pytest.mark.broker,
    pytest.mark.browser,
    pytest.mark.slow,
    pytest.mark.asyncio(loop_scope="module"),
    pytest.mark.timeout(420),
]
BULK = 500
HOLD_FROM = 100  # the jobs from here on wait for the test's go, so a kill lands mid-run


async def shot(page: Any, dash: Dash, name: str) -> Path:
    """A screenshot in the test's folder (copied into docs/img by hand when the pages change)."""
    path = dash.shots / f"{name}.png"
    await page.screenshot(path=str(path), full_page=True)
    assert path.stat().st_size > 10_000
    return path


async def test_overview_shows_real_counts_and_updates_live(page: Any, dash: Dash) -> None:
    first = await dash.enqueue("b.flaky")
    await dash.wait_status(first, "succeeded")
    await page.goto("/")
    await expect(page.locator("#live-state")).to_have_text("live")
    succeeded = int(await page.locator("#status-succeeded").inner_text())
    assert succeeded >= 1
    retries = int(await page.locator("#total-retries").inner_text())
    assert retries >= 1  # b.flaky's first attempt fails on purpose
    assert await page.evaluate(
        "Chart.getChart(document.getElementById('chart-rates')) !== undefined"
    )
    loaded_version = await page.evaluate("document.body.dataset.version")
    job_id = await dash.enqueue("b.flaky")
    await dash.wait_status(job_id, "succeeded")
    # No reload: the server-sent events bring the new count.
    await expect(page.locator("#status-succeeded")).not_to_have_text(str(succeeded))
    assert int(await page.locator("#status-succeeded").inner_text()) > succeeded
    await expect(page.locator("#total-retries")).not_to_have_text(str(retries))
    await expect(page.locator("#totals-note")).to_contain_text("since the namespace began")
    assert await page.evaluate("document.body.dataset.version") != loaded_version
    await expect(page.locator("#workers")).to_contain_text("worker-")
    await expect(page.locator("#partitions tbody tr")).to_have_count(3)
    # The owner column is the node group's assignment: the stack's one node holds all three.
    owners = page.locator("#partitions tbody tr td:nth-child(4)")
    await expect(owners).to_have_text(["node-node-1"] * 3)
    await shot(page, dash, "dashboard-overview")


# The overview's own update, fed a series with a ten-second hole; read back in the same task, so
# no live update can come between. Per dataset: its x scale, pixel xs, line tension and segments.
GAPPED = """(() => {
  const chart = (id) => Chart.getChart(document.getElementById(id));
  const charts = { rates: chart("chart-rates"), depth: chart("chart-depth"),
                   status: chart("chart-status") };
  const data = JSON.parse(document.getElementById("overview-data").textContent);
  const t0 = Math.floor(Date.now() / 1000);
  data.series = { t: [t0, t0 + 1, t0 + 2, t0 + 12], started: [3, 1, 4, 1],
                  finished: [2, 7, 1, 8], depth: { default: [5, null, 4, 3] } };
  updateOverview(charts, data);
  const seen = (c) => c.data.datasets.map((d, i) => {
    const meta = c.getDatasetMeta(i);
    return { pixels: meta.data.map((p) => p.x), tension: meta.dataset.options.tension,
             cubic: meta.dataset.options.cubicInterpolationMode,
             segments: meta.dataset.segments.length, xs: d.data.map((p) => p.x) };
  });
  const x = charts.rates.scales.x;
  return { t0, type: x.type, depthType: charts.depth.scales.x.type,
           labels: x.ticks.map((k) => k.label),
           rates: seen(charts.rates), depth: seen(charts.depth) };
})()"""


async def test_overview_charts_put_samples_at_their_time(page: Any, dash: Dash) -> None:
    await page.goto("/")
    await expect(page.locator("#live-state")).to_have_text("live")
    assert (
        await page.evaluate("Chart.getChart(document.getElementById('chart-rates')).scales.x.type")
        == "linear"
    )
    seen = await page.evaluate(GAPPED)
    assert (seen["type"], seen["depthType"]) == ("linear", "linear")  # not "category"
    t0_ms = seen["t0"] * 1000
    for line in [*seen["rates"], *seen["depth"]]:
        assert line["xs"] == [t0_ms, t0_ms + 1000, t0_ms + 2000, t0_ms + 12_000]  # epoch ms
        assert (line["tension"], line["cubic"]) == (0, "default")  # straight, not smoothed
        one_second = line["pixels"][1] - line["pixels"][0]
        assert one_second > 0
        assert line["pixels"][2] - line["pixels"][1] == pytest.approx(one_second, abs=0.5)
        # The hole keeps its ten seconds: a category axis would draw it one step wide.
        assert line["pixels"][3] - line["pixels"][2] == pytest.approx(10 * one_second, abs=1)
    # The rates break across the hole; a queue's depth goes straight across it (and its null).
    assert [line["segments"] for line in seen["rates"]] == [2, 2]
    assert [line["segments"] for line in seen["depth"]] == [1]
    assert seen["labels"] and all(
        re.fullmatch(r"\d\d:\d\d:\d\d", label) for label in seen["labels"]
    )


async def test_jobs_list_job_timeline_and_time_travel(page: Any, dash: Dash) -> None:
    job_id = await dash.enqueue("b.flaky")
    await dash.wait_status(job_id, "succeeded")
    await page.goto("/jobs?task=b.flaky&status=succeeded")
    await page.click(f"a[href='/jobs/{job_id}']")
    await expect(page.locator("#state-status")).to_have_text("succeeded")
    await expect(page.locator("#timeline tbody tr").first).to_be_visible()
    events = await page.locator("#timeline tbody tr").count()
    chart = await page.evaluate(
        "(() => { const c = Chart.getChart(document.getElementById('chart-timeline'));"
        " return c.data.datasets.map((d) => d.data.length); })()"
    )
    assert chart == [2, 2, events]  # two leases, two attempts, every event a point
    height = await page.evaluate(
        "document.getElementById('chart-timeline').parentElement.style.height"
    )
    assert height == f"{70 + 36 * 3}px"  # set by dashboard.js: a row each for the job, 2 tokens
    await shot(page, dash, "dashboard-job-timeline")
    # Time travel: the option of the first AttemptFailed, where the job waits for its retry.
    option = page.locator("#as-of option", has_text="AttemptFailed")
    offset = await option.get_attribute("value")
    await page.select_option("#as-of", offset)  # the page submits the form itself
    await expect(page.locator("#state-title")).to_have_text(f"State as of offset {offset}")
    await expect(page.locator("#state-status")).to_have_text("scheduled")
    assert re.search(rf"as_of={offset}$", page.url)


async def test_requeue_from_the_dead_letters_runs_the_job_again(page: Any, dash: Dash) -> None:
    job_id = await dash.enqueue("b.until", str(dash.marks))
    await dash.wait_status(job_id, "dead")
    (dash.marks / "go").touch()
    await page.goto("/dead-letters?task=b.until")
    await expect(page.locator("#groups")).to_contain_text("ValueError")
    await page.check(f"input[name=ids][value='{job_id}']")
    await page.click("#requeue-selected button[type=submit]")
    await expect(page.locator(".flash")).to_contain_text("requeued 1 of 1")
    await dash.wait_status(job_id, "succeeded")
    await page.goto(f"/jobs/{job_id}")
    await expect(page.locator("#state-status")).to_have_text("succeeded")
    await expect(page.locator("#timeline")).to_contain_text("JobRequeued")


async def test_schedules_page_shows_a_schedule_paused_resumed_and_deleted(
    page: Any, dash: Dash
) -> None:
    body = {"cron": "*/5 * * * *", "timezone": "UTC", "task": "b.flaky"}
    created = await dash.http.put("/v1/schedules/browser-five", json=body)
    assert created.status_code == 201, created.text
    await page.goto("/schedules")
    row = page.locator("#schedules tbody tr", has_text="browser-five")
    await expect(row).to_contain_text("*/5 * * * *")
    await expect(row.locator("td").nth(6)).not_to_have_text("—")  # its next fire
    await expect(row.locator(".schedule-state")).to_have_text("active")
    await row.get_by_role("button", name="Pause").click()
    await expect(row.locator(".schedule-state")).to_have_text("paused")
    await row.get_by_role("button", name="Resume").click()
    await expect(row.locator(".schedule-state")).to_have_text("active")
    await row.get_by_role("button", name="Delete").click()
    await expect(page.locator(".flash")).to_contain_text("browser-five")
    gone = await dash.http.get("/v1/schedules/browser-five")
    assert gone.status_code == 404


async def test_500_jobs_through_a_worker_sigkill_succeed_once_each(page: Any, dash: Dash) -> None:
    await page.goto("/")
    await expect(page.locator("#live-state")).to_have_text("live")
    enqueued = asyncio.ensure_future(_enqueue_many(dash, range(BULK)))
    workers = {p.pid: p for p in dash.stack.procs if p.name.startswith("worker-")}

    async def held_by_a_worker() -> Any:
        # A held job is surely still running; its worker id is "<host>-<pid>-<suffix>".
        running = await dash.http.get("/v1/jobs", params={"status": "running", "queue": "bulk"})
        for job in running.json()["jobs"]:
            pid = int(job["worker_id"].split("-")[-2])
            if job["args"][0] >= HOLD_FROM and pid in workers:
                return workers[pid]
        return None

    victim = await wait_for(held_by_a_worker, what="a worker running a held job", timeout_s=120)
    assert await _bulk_count(page, "succeeded") >= 1  # the first jobs ran through
    victim.kill()
    (dash.marks / "go-bulk").touch()
    await enqueued
    succeeded = page.locator("#queues tbody tr", has_text="bulk").locator("td").nth(4)
    await expect(succeeded).to_have_text(str(BULK), timeout=240_000)
    assert await page.locator("#queues thead th").nth(4).text_content() == "succeeded"
    effects = await _effects_read_back(dash)
    assert sum(effects.values()) == BULK and len(effects) == BULK
    folded = await dash.stack.check(all_terminal=False)
    bulk = [j for j in folded.jobs.values() if j.queue == "bulk"]
    assert len(bulk) == BULK and {j.status.value for j in bulk} == {"succeeded"}
    assert any(j.token > 1 for j in bulk), "the kill should have cut attempts short"


async def _enqueue_many(dash: Dash, numbers: range, at_once: int = 25) -> None:
    for start in range(numbers.start, numbers.stop, at_once):
        chunk = range(start, min(start + at_once, numbers.stop))
        await asyncio.gather(
            *(dash.enqueue("b.work", n, str(dash.marks), n >= HOLD_FROM) for n in chunk)
        )


async def _bulk_count(page: Any, status: str) -> int:
    headers = [h.strip() for h in await page.locator("#queues thead th").all_text_contents()]
    row = page.locator("#queues tbody tr", has_text="bulk")
    if await row.count() == 0:
        return 0
    return int(await row.locator("td").nth(headers.index(status)).inner_text())


async def _effects_read_back(dash: Dash) -> Counter[str]:
    """Effects per job, read with a plain consumer of the effects topic (read_committed)."""
    topic = dash.stack.topics.effects
    consumer = AIOKafkaConsumer(
        bootstrap_servers=dash.stack.bootstrap,
        isolation_level="read_committed",
        enable_auto_commit=False,
        auto_offset_reset="earliest",
    )
    await consumer.start()
    try:
        parts = [
            TopicPartition(topic, p)
            for p in range(await partition_count(dash.stack.bootstrap, topic))
        ]
        consumer.assign(parts)
        await consumer.seek_to_beginning(*parts)
        end = await consumer.end_offsets(parts)
        seen: Counter[str] = Counter()
        while any([await consumer.position(tp) < end[tp] for tp in parts]):
            for records in (await consumer.getmany(timeout_ms=500)).values():
                for record in records:
                    headers = dict(record.headers or ())
                    seen[headers["evsched-job-id"].decode()] += 1
        return seen
    finally:
        await consumer.stop()


async def test_jobs_list_as_of_a_time_shows_the_jobs_of_then(page: Any, dash: Dash) -> None:
    """The jobs page's "as of" field: the jobs as they were at a time between two enqueues,
    from an index the API rebuilds (the page says so and reloads while it is built); the
    overview's, the counts of then."""

    async def enqueue() -> str:
        body = {"task": "b.flaky", "labels": {"as-of": "run"}}
        response = await dash.http.post("/v1/jobs", json=body)
        assert response.status_code == 201, response.text
        job_id: str = response.json()["id"]
        await dash.wait_status(job_id, "succeeded")
        return job_id

    before = await enqueue()
    at = now_ms()

    async def clock_moved() -> bool:
        return now_ms() > at + 1

    await wait_for(clock_moved, what="the clock to pass T")
    after = await enqueue()
    await page.goto("/jobs?label=as-of%3Drun")
    await expect(page.locator(f"a[href='/jobs/{after}']")).to_be_visible()
    await page.fill("#filters input[name=as_of]", str(AtTime(at)))
    await page.click("#filters button[type=submit]")
    await expect(page.locator("#as-of")).to_be_visible(timeout=90_000)  # built, then reloaded
    await expect(page.locator(f"a[href='/jobs/{before}']")).to_be_visible()
    await expect(page.locator(f"a[href='/jobs/{after}']")).to_have_count(0)
    await expect(page.locator("#jobs tbody tr")).to_have_count(1)
    assert "as_of=" in page.url
    await shot(page, dash, "dashboard-jobs-as-of")
    # The overview as of the same time: the counts GET /v1/stats?as_of= gives (cached now).
    stats = (await dash.http.get("/v1/stats", params={"as_of": str(AtTime(at))})).json()
    await page.goto("/")
    await page.fill("#as-of-form input[name=as_of]", str(AtTime(at)))
    await page.click("#as-of-form button[type=submit]")
    await expect(page.locator("#as-of")).to_be_visible(timeout=90_000)
    await expect(page.locator("#total")).to_have_text(str(stats["total"]))
    succeeded = str(stats["by_status"]["succeeded"])
    await expect(page.locator("#status-succeeded")).to_have_text(succeeded)
