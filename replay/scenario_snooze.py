"""The ``snooze`` recording (fold version 10, issue 35): a handler's Snooze spends no attempt.

A job whose handler snoozes twice for 1 s (raising the first Snooze, returning the second) and then
succeeds, at attempt 1 under its third token. A job of a task that allows one snooze, whose
handler always snoozes: its first snooze is applied, its second is a failed attempt of category
``snooze_limit``, and after a retry it is dead. A hostile producer's snoozes, each refused with
its reason: of the succeeded job with its last token (the job has ended) and with its first
(``stale``), a negative delay, a delay past 30 days, a negative cap, and a job never enqueued.
They carry the proof a worker holding each token's lease would make (a buggy or zombie worker
of the job, not an unproven forger), so the fold judges each on its merits.
"""

from __future__ import annotations

from replay.scenarios import until_node_past_the_end, until_status
from tests.integration.engine import Stack

from evsched.adapters import avro
from evsched.adapters.kafka import clients as kafka
from evsched.adapters.proofs import PROOF_HEADER, worker_proof
from evsched.core.bounds import MAX_SNOOZE_MS
from evsched.core.events import AttemptSnoozed
from evsched.core.state import Status, Verdict


async def snooze(stack: Stack) -> None:
    stack.start_node("node-1", "--dispatch-timeout-s", "10")
    stack.start_worker("worker-1")
    marks = stack.tmp / "snooze"
    marks.mkdir()
    async with stack.app() as app:
        twice = await app.get_task("s.snooze").enqueue(str(marks), 2, 1.0)
        capped = await app.get_task("s.snooze_capped").enqueue()
        await until_status(stack, [twice], Status.SUCCEEDED)
        await until_status(stack, [capped], Status.DEAD)
        done = await stack.job(twice)
        assert done is not None and (done.attempt, done.token, done.snoozes) == (1, 3, 2), done
        await _produce_proven(stack, _forged(twice, last_token=done.token))
    await until_node_past_the_end(stack)
    verdicts = [e.verdict for e in await stack.timeline(twice) if e.source == "worker-forger"]
    assert verdicts == [Verdict.REJECTED, Verdict.STALE, *[Verdict.REJECTED] * 3], verdicts


async def _produce_proven(stack: Stack, events: list[AttemptSnoozed]) -> None:
    """Write each snooze with the proof of a worker holding its token's lease."""
    producer = kafka.producer(stack.settings, client_id="corpus-snoozes")
    await producer.start()
    try:
        for event in events:
            value = avro.encode_event(event)
            proof = worker_proof(stack.keyring.lease_key(event.job_id, event.token), value)
            await producer.send_and_wait(
                stack.topics.events,
                value,
                key=event.job_id.encode(),
                headers=[(PROOF_HEADER, proof)],
            )
    finally:
        await producer.stop()


def _forged(job_id: str, last_token: int) -> list[AttemptSnoozed]:
    """Snoozes no worker of the job would send: each is refused with a reason."""
    meta = {"emitted_at": 0, "source": "worker-forger", "max_snoozes": 25}
    events = [
        AttemptSnoozed(event_id="forged-s1", job_id=job_id, token=last_token, delay_ms=1, **meta),
        AttemptSnoozed(event_id="forged-s2", job_id=job_id, token=1, delay_ms=1, **meta),
        AttemptSnoozed(event_id="forged-s3", job_id=job_id, token=last_token, delay_ms=-1, **meta),
        AttemptSnoozed(
            event_id="forged-s4",
            job_id=job_id,
            token=last_token,
            delay_ms=MAX_SNOOZE_MS + 1,
            **meta,
        ),
        AttemptSnoozed(
            event_id="forged-s5",
            job_id=job_id,
            token=last_token,
            delay_ms=1,
            emitted_at=0,
            source="worker-forger",
            max_snoozes=-1,
        ),
        AttemptSnoozed(event_id="forged-s6", job_id="never-enqueued", token=1, delay_ms=1, **meta),
    ]
    return events
