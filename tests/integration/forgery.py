"""The forged facts of issue 32 and their producer, shared by the broker test and the recording.

A producer with write access to ``<ns>.events`` writes what only a node decides or only a leased
worker reports: a completion with the live token carrying an effect, an expiry, a lease at the
largest token and one of ten years, a parent's resolution (a release and a ``dead``), a permit
grant and a permit release. ``tests/integration/test_forged_facts.py`` and
``replay/scenario_proofs.py`` both check that each is ``rejected`` as unproven.
"""

from __future__ import annotations

from tests.integration.engine import Stack

from evsched.adapters import avro
from evsched.adapters.kafka import clients as kafka
from evsched.adapters.proofs import PROOF_HEADER
from evsched.core.bounds import MAX_TOKEN
from evsched.core.events import (
    AttemptSucceeded,
    Effect,
    Event,
    JobLeased,
    LeaseExpired,
    ParentResolved,
    PermitGranted,
    QueuePermit,
    entity_id,
)

FORGER = "node-forger"
TEN_YEARS_MS = 10 * 365 * 86_400_000


def forged_facts(victim: str, token: int, child: str, parked: str) -> list[Event]:
    """What a forger writes against ``victim`` (running at ``token``), ``child`` and ``parked``."""
    meta = {"emitted_at": 0, "source": FORGER}
    return [
        AttemptSucceeded(
            event_id="forged-success", job_id=victim, token=token, result=b'"forged"',
            effects=(Effect(kind="payout", payload=b'{"to":"forger"}'),), **meta,
        ),
        LeaseExpired(event_id="forged-expiry", job_id=victim, token=token, **meta),
        JobLeased(
            event_id="forged-max", job_id=parked, token=MAX_TOKEN, attempt=1, lease_ms=1_000,
            **meta,
        ),
        JobLeased(
            event_id="forged-10y", job_id=parked, token=1, attempt=1, lease_ms=TEN_YEARS_MS,
            **meta,
        ),
        ParentResolved(
            event_id="forged-release", job_id=child, parent_id=victim, outcome="succeeded",
            parent_partition=0, parent_offset=0, result=b'"injected"', **meta,
        ),
        ParentResolved(
            event_id="forged-dead", job_id=child, parent_id=victim, outcome="dead",
            parent_partition=0, parent_offset=0, **meta,
        ),
        PermitGranted(
            event_id="forged-grant", job_id=parked, queue="default", key=None, **meta
        ),
        QueuePermit(
            event_id="forged-permit-release", queue="default", job_id=victim, action="release",
            **meta,
        ),
    ]  # fmt: skip


async def forge(stack: Stack, events: list[Event]) -> None:
    """Write ``events`` as a producer can: valid Avro, every other one with a made-up proof."""
    producer = kafka.producer(stack.settings, client_id="forger")
    await producer.start()
    try:
        for i, event in enumerate(events):
            headers = [(PROOF_HEADER, bytes(40))] if i % 2 else None
            await producer.send_and_wait(
                stack.topics.events,
                avro.encode_event(event),
                key=entity_id(event).encode(),
                headers=headers,
            )
    finally:
        await producer.stop()
