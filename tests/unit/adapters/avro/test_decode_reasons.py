"""Issue 9 B.4: the reason stored for bytes that do not decode is a pure function of the bytes.

A record cut inside a ``double`` gave ``cannot read double from <_io.BytesIO object at 0x...>``: two
rebuilds of one log stored different reasons, so their digests differed.
"""

from __future__ import annotations

import json
import struct
import subprocess
import sys

from evsched.adapters import avro
from evsched.core import events as ev
from evsched.errors import DecodeError

SAMPLES: list[ev.Event] = [
    ev.JobEnqueued(
        event_id="e1",
        job_id="j1",
        emitted_at=1,
        source="client",
        task="t",
        queue="q",
        args=b"{}",
        labels={"a": "b"},
        trace=ev.TraceContext(traceparent="00-" + "1" * 32 + "-" + "2" * 16 + "-01"),
    ),
    ev.ScheduleUpserted(
        event_id="e2",
        schedule_id="s",
        emitted_at=2,
        source="api",
        cron="* * * * *",
        timezone="UTC",
        template=ev.JobTemplate(task="t", queue="q", args=b"[]"),
    ),
    ev.AttemptSucceeded(
        event_id="e3",
        job_id="j1",
        emitted_at=3,
        source="w",
        token=1,
        result=b"r",
        effects=(ev.Effect(kind="k", payload=b"p"),),
    ),
]


def reasons() -> list[str]:
    """The reason of every truncation of every sample, in order."""
    found = []
    for event in SAMPLES:
        data = avro.encode_event(event)
        for size in range(len(data)):
            try:
                avro.decode_event(data[:size])
            except DecodeError as exc:
                found.append(exc.reason)
            else:
                found.append("decoded")
    return found


def test_a_record_cut_inside_a_double_has_a_reason_without_an_address() -> None:
    data = avro.encode_event(SAMPLES[0])
    # The retry policy's jitter is a double: cut the record 3 bytes into it.
    cut = data[: data.rindex(struct.pack("<d", ev.RetryPolicy().jitter)) + 3]
    try:
        avro.decode_event(cut)
    except DecodeError as exc:
        assert exc.reason == "truncated: cannot read double from the record"
    else:  # pragma: no cover - the cut record must not decode
        raise AssertionError("a record cut inside a double decoded")


def test_every_truncation_reason_is_the_same_in_another_process() -> None:
    here = reasons()
    assert not [r for r in here if "0x" in r]
    code = f"import json; from {__name__} import reasons; print(json.dumps(reasons()))"
    out = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True, timeout=120
    )
    assert json.loads(out.stdout) == here
