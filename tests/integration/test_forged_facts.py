"""The review's forged facts on the real broker, with a real node and worker (issue 32, item 1).

A producer with write access to ``<ns>.events`` writes what only a node decides or only a leased
worker reports: a lease at the largest token, a lease of ten years, an expiry, a parent's
resolution (a release and a ``dead``), a completion with the live token (read off the log's
``JobLeased``) carrying an effect, a permit grant and a permit release. Each is ``rejected`` as
unproven, nothing of it is published, and the real attempt, proven by the worker with its lease's
key, succeeds once.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from tests.conftest import unique_name
from tests.integration.engine import Stack, wait_for
from tests.integration.forgery import forge, forged_facts
from tests.integration.node_app import make_app

from evsched.adapters.kafka.topics import ensure_topics
from evsched.core import roles
from evsched.core.events import Event, QueuePermit, entity_id
from evsched.core.state import Status, TimelineEntry, Verdict

pytestmark = [pytest.mark.broker, pytest.mark.slow, pytest.mark.timeout(600)]

APP = "tests.integration.node_app:app"


@pytest.fixture
async def stack(kafka_bootstrap: str, tmp_path: Path) -> AsyncIterator[Stack]:
    # One partition: it requires proofs from the node's first decision on, for every job here.
    namespace = unique_name("forged")
    await ensure_topics(kafka_bootstrap, namespace, event_partitions=1, queues=["default"])
    engine = Stack(kafka_bootstrap, namespace, tmp_path, partitions=1)
    try:
        yield engine
    finally:
        await engine.close()


async def entry_of(stack: Stack, event: Event) -> TimelineEntry:
    """How the stack's replica (with the node keys) judged ``event``."""
    replica = await stack.replica()
    index = replica.index(0)

    async def probe() -> TimelineEntry | None:
        if isinstance(event, QueuePermit):  # a permit step is on its limit's own timeline
            entries = [e for e, _ in index.permit_timeline_events(event.queue)]
        else:
            entries = index.timeline(entity_id(event))
        found = [e for e in entries if e.event_id == event.event_id]
        return found[0] if found else None

    return await wait_for(probe, what=f"{event.event_id} folded")


async def test_every_forged_fact_is_rejected_and_the_real_attempt_succeeds(stack: Stack) -> None:
    stack.start_node()
    stack.start_worker("worker-1", app=APP)
    async with make_app(stack.settings) as app:
        sleep = app.get_task("n.sleep")
        victim = await sleep.enqueue(6.0)
        running = await stack.wait_status(victim, Status.RUNNING)
        child = await sleep.options(after=[victim]).enqueue(0.0)
        idle = await sleep.options(delay=3600.0).enqueue(0.0)
    await stack.wait_status(child, Status.WAITING)
    token = running.token  # the live token: every JobLeased on the log shows it
    forged = forged_facts(victim, token, child, idle)
    await forge(stack, forged)
    for event in forged:
        entry = await entry_of(stack, event)
        assert entry.verdict is Verdict.REJECTED, (event.event_id, entry.reason)
        assert roles.is_unproven(entry.reason), (event.event_id, entry.reason)
    # The real attempt, proven by the worker, ends the victim; its success releases the child.
    done = await stack.wait_status(victim, Status.SUCCEEDED, timeout_s=60)
    assert (done.token, done.result) == (token, b"null")
    await stack.wait_status(child, Status.SUCCEEDED, timeout_s=60)
    parked = await stack.job(idle)
    assert parked is not None and (parked.status, parked.token) == (Status.SCHEDULED, 0)
    # Nothing of the forged success was published.
    assert await stack.read_topic(stack.topics.effects) == []
    # The nodes' own facts carried proofs the fold accepted: the log replays the same way.
    folded = await stack.check(all_terminal=False)
    assert not folded.violations
