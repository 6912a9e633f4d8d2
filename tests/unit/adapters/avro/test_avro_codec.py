"""The Avro codec: round trips, byte stability, schema evolution, and DecodeError for bad bytes."""

from __future__ import annotations

import contextlib
import dataclasses
import io
from typing import Any

import pytest
from fastavro import parse_schema, schemaless_writer
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from evsched.adapters import avro
from evsched.adapters.avro.mapping import mapper_for
from evsched.adapters.avro.registry import MAGIC, SchemaRegistry, schema_fingerprint
from evsched.adapters.contract import load_schema_files
from evsched.core.events import (
    EVENT_TYPES,
    AttemptFailed,
    JobEnqueued,
    RetryPolicy,
    ScheduleFired,
    ScheduleUpserted,
    TraceContext,
)
from evsched.core.state import JobState, ScheduleState, Status, TimelineEntry, Verdict
from evsched.errors import DecodeError, EncodeError
from tests.states import job_state
from tests.strategies import (
    EVENT_STRATEGIES,
    events,
    job_states,
    records,
    schedule_states,
    timeline_entries,
)

REGISTRY = SchemaRegistry.from_contract()
FUZZ = settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])


def _enqueued(**changes: Any) -> JobEnqueued:
    base = JobEnqueued(
        event_id="e-1",
        job_id="j-1",
        emitted_at=1_700_000_000_000,
        source="client",
        task="email.send",
        queue="default",
        args=b'{"to": "a@example.com"}',
    )
    return dataclasses.replace(base, **changes)


# --- events -------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", EVENT_TYPES, ids=lambda kind: kind.__name__)
@given(data=st.data())
def test_every_event_kind_round_trips_byte_for_byte(kind: type[Any], data: st.DataObject) -> None:
    event = data.draw(EVENT_STRATEGIES[kind])
    encoded = avro.encode_event(event)

    assert encoded[:2] == MAGIC
    assert encoded[2:10] == REGISTRY.current(kind.__name__).fingerprint
    decoded = avro.decode_event(encoded)
    assert type(decoded) is kind
    assert decoded == event
    assert avro.encode_event(decoded) == encoded


def test_nested_records_decode_to_dataclasses_and_arrays_to_tuples() -> None:
    event = _enqueued(trace=TraceContext(traceparent="00-abc-def-01"), labels={"team": "a"})
    decoded = avro.decode_event(avro.encode_event(event))

    assert isinstance(decoded, JobEnqueued)
    assert isinstance(decoded.retry, RetryPolicy)
    assert isinstance(decoded.trace, TraceContext)
    state = avro.decode_state(avro.encode_state(_job_state(recent_event_ids=("a",))), JobState)
    assert state.recent_event_ids == ("a",)
    assert type(state.status) is Status


@given(labels=st.dictionaries(st.text(max_size=5), st.text(max_size=5), max_size=6))
def test_equal_labels_encode_equally_whatever_their_insertion_order(labels: dict[str, str]) -> None:
    reversed_labels = dict(reversed(list(labels.items())))

    assert avro.encode_event(_enqueued(labels=labels)) == avro.encode_event(
        _enqueued(labels=reversed_labels)
    )


def test_negative_zero_encodes_like_zero_since_the_values_are_equal() -> None:
    positive = _enqueued(retry=RetryPolicy(jitter=0.0))
    negative = _enqueued(retry=RetryPolicy(jitter=-0.0))

    assert positive == negative
    assert avro.encode_event(positive) == avro.encode_event(negative)


def test_unencodable_values_raise_encode_error() -> None:
    with pytest.raises(EncodeError):
        avro.encode_event(_enqueued(priority=2**64))
    with pytest.raises(EncodeError):
        avro.encode_event(object())  # type: ignore[arg-type]


# --- schema evolution ---------------------------------------------------------------------------


# What an enqueue written before fold version 4 has: no parents, no uniqueness scope.
NO_WORKFLOW: dict[str, Any] = {
    "after": (),
    "after_rule": "all_succeeded",
    "results_to_args": "none",
}
NEW_IN_V4: dict[str, Any] = {**NO_WORKFLOW, "unique": None, "unique_period_ms": None}


def _v1_writer() -> Any:
    (writer,) = (w for w in REGISTRY.writers() if w.origin == "history/JobEnqueued.v1.avsc")
    return writer


@given(event=records(JobEnqueued))
def test_v1_job_enqueued_decodes_to_the_current_type_with_defaults(event: JobEnqueued) -> None:
    writer = _v1_writer()
    record = mapper_for(JobEnqueued).to_avro(event)
    del record["labels"], record["trace"]
    body = io.BytesIO()
    schemaless_writer(body, writer.schema, record)

    decoded = avro.decode_event(MAGIC + writer.fingerprint + body.getvalue())

    assert decoded == dataclasses.replace(
        event, labels={}, trace=None, retention_ms=None, key_window_ms=None, **NEW_IN_V4
    )


@given(event=records(JobEnqueued))
def test_v2_job_enqueued_decodes_with_the_default_windows(event: JobEnqueued) -> None:
    (writer,) = (w for w in REGISTRY.writers() if w.origin == "history/JobEnqueued.v2.avsc")
    record = mapper_for(JobEnqueued).to_avro(event)
    del record["retention_ms"], record["key_window_ms"]
    body = io.BytesIO()
    schemaless_writer(body, writer.schema, record)

    decoded = avro.decode_event(MAGIC + writer.fingerprint + body.getvalue())

    assert decoded == dataclasses.replace(event, retention_ms=None, key_window_ms=None, **NEW_IN_V4)


@given(event=records(JobEnqueued))
def test_v3_job_enqueued_decodes_waiting_on_no_parents(event: JobEnqueued) -> None:
    (writer,) = (w for w in REGISTRY.writers() if w.origin == "history/JobEnqueued.v3.avsc")
    record = mapper_for(JobEnqueued).to_avro(event)
    for field in NEW_IN_V4:
        del record[field]
    body = io.BytesIO()
    schemaless_writer(body, writer.schema, record)

    decoded = avro.decode_event(MAGIC + writer.fingerprint + body.getvalue())

    assert decoded == dataclasses.replace(event, **NEW_IN_V4)


def test_the_history_schema_is_a_distinct_writer_of_the_same_kind() -> None:
    writer = _v1_writer()

    assert writer.kind == "JobEnqueued"
    assert not writer.current
    assert writer.fingerprint != REGISTRY.current("JobEnqueued").fingerprint


# --- bad bytes ----------------------------------------------------------------------------------


def _reason(data: bytes) -> str:
    with pytest.raises(DecodeError) as caught:
        avro.decode_event(data)
    return caught.value.reason


def test_wrong_magic_is_a_decode_error() -> None:
    encoded = avro.encode_event(_enqueued())

    assert "magic" in _reason(b"\xc3\x02" + encoded[2:])
    assert "magic" in _reason(b"")
    assert "magic" in _reason(b'{"json": true}')


def test_unknown_fingerprint_is_a_decode_error() -> None:
    encoded = avro.encode_event(_enqueued())

    assert "fingerprint" in _reason(MAGIC + bytes(8) + encoded[10:])


def test_every_truncation_is_a_decode_error() -> None:
    encoded = avro.encode_event(_enqueued(labels={"a": "b"}))

    for end in range(len(encoded)):
        with pytest.raises(DecodeError):
            avro.decode_event(encoded[:end])


def test_trailing_bytes_are_a_decode_error() -> None:
    encoded = avro.encode_event(_enqueued())

    assert "trailing" in _reason(encoded + b"\x00")


def test_bytes_that_are_not_utf8_where_a_string_is_expected_are_a_decode_error() -> None:
    event = AttemptFailed(
        event_id="e", job_id="j", emitted_at=0, source="w", token=1, error_type="E", message="m"
    )
    encoded = avro.encode_event(event)
    corrupted = encoded.replace(b"\x02m", b"\x02\xff")

    assert "UnicodeDecodeError" in _reason(corrupted)


def _decodes_or_raises_decode_error(data: bytes) -> None:
    try:
        event = avro.decode_event(data)
    except DecodeError:
        return
    # Whatever decodes must be writable again: a node stores what it folds.
    avro.encode_event(event)


@FUZZ
@given(data=st.binary(max_size=64))
@example(data=MAGIC)
@example(data=MAGIC + REGISTRY.current("JobLeased").fingerprint)
def test_arbitrary_bytes_raise_only_decode_error(data: bytes) -> None:
    _decodes_or_raises_decode_error(data)


@FUZZ
@given(
    header=st.sampled_from([MAGIC + w.fingerprint for w in REGISTRY.writers()]),
    body=st.binary(max_size=96),
)
def test_arbitrary_bodies_under_known_fingerprints_raise_only_decode_error(
    header: bytes, body: bytes
) -> None:
    _decodes_or_raises_decode_error(header + body)


@st.composite
def _mutations(draw: st.DrawFn) -> bytes:
    encoded = bytearray(avro.encode_event(draw(events())))
    for _ in range(draw(st.integers(1, 4))):
        at = draw(st.integers(0, len(encoded)))
        action = draw(st.sampled_from(["flip", "insert", "delete", "cut"]))
        if action == "flip" and at < len(encoded):
            encoded[at] ^= draw(st.integers(1, 255))
        elif action == "insert":
            encoded[at:at] = draw(st.binary(min_size=1, max_size=4))
        elif action == "delete":
            del encoded[at : at + draw(st.integers(1, 4))]
        else:
            del encoded[at:]
    return bytes(encoded)


@FUZZ
@given(data=_mutations())
def test_mutated_encodings_raise_only_decode_error(data: bytes) -> None:
    _decodes_or_raises_decode_error(data)


# --- projections --------------------------------------------------------------------------------


def _job_state(**changes: Any) -> JobState:
    return job_state(**({"run_at": 1, "enqueued_at": 1, "updated_at": 1} | changes))


@given(state=job_states())
def test_job_state_round_trips_byte_for_byte(state: JobState) -> None:
    encoded = avro.encode_job_state(state)

    assert avro.decode_job_state(encoded) == state
    assert avro.encode_job_state(avro.decode_job_state(encoded)) == encoded
    assert avro.encode_state(state) == encoded
    assert avro.decode_state(encoded, JobState) == state


@given(state=schedule_states())
def test_schedule_state_round_trips_byte_for_byte(state: ScheduleState) -> None:
    encoded = avro.encode_schedule_state(state)

    assert avro.decode_schedule_state(encoded) == state
    assert avro.encode_schedule_state(avro.decode_schedule_state(encoded)) == encoded
    assert avro.encode_state(state) == encoded
    assert avro.decode_state(encoded, ScheduleState) == state


@given(entry=timeline_entries())
def test_timeline_entry_round_trips_byte_for_byte(entry: TimelineEntry) -> None:
    encoded = avro.encode_timeline(entry)
    decoded = avro.decode_timeline(encoded)

    assert decoded == entry
    assert type(decoded.verdict) is Verdict
    assert avro.encode_timeline(decoded) == encoded


def test_equal_states_with_differently_ordered_labels_encode_equally() -> None:
    one = _job_state(labels={"a": "1", "b": "2"})
    other = _job_state(labels={"b": "2", "a": "1"})

    assert avro.encode_job_state(one) == avro.encode_job_state(other)


@FUZZ
@given(data=st.binary(max_size=96))
def test_garbage_projection_values_raise_only_decode_error(data: bytes) -> None:
    for decode in (avro.decode_job_state, avro.decode_schedule_state, avro.decode_timeline):
        with contextlib.suppress(DecodeError):
            decode(data)


def test_a_projection_value_with_trailing_bytes_is_a_decode_error() -> None:
    with pytest.raises(DecodeError, match="trailing"):
        avro.decode_job_state(avro.encode_job_state(_job_state()) + b"\x00")


def test_encode_state_rejects_what_is_not_a_state() -> None:
    with pytest.raises(EncodeError):
        avro.encode_state(_enqueued())  # type: ignore[arg-type]


# --- fingerprints -------------------------------------------------------------------------------


def test_fingerprint_is_crc64_avro_in_little_endian_byte_order() -> None:
    # The Avro specification's published CRC-64-AVRO vector for the schema "null".
    assert schema_fingerprint("null") == (7195948357588979594).to_bytes(8, "little")


def test_fingerprints_ignore_docs_and_defaults_but_not_field_names() -> None:
    schema = load_schema_files("schemas")["LeaseExpired.avsc"]
    undocumented = {**schema, "doc": "other", "fields": [dict(schema["fields"][0], doc="x")]}
    renamed = {**undocumented, "fields": [dict(schema["fields"][0], name="event_uuid")]}

    assert parse_schema(undocumented)
    assert schema_fingerprint(undocumented) != schema_fingerprint(renamed)
    assert schema_fingerprint({**schema, "doc": "other"}) == schema_fingerprint(schema)


@pytest.mark.parametrize(
    ("kind", "dropped"),
    [
        (ScheduleUpserted, ("catchup_window_ms", "max_jitter_ms", "overlap")),
        (ScheduleFired, ("decision", "run_at")),
    ],
)
@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_v1_schedule_events_decode_without_cron_policies(
    kind: type[ScheduleUpserted | ScheduleFired], dropped: tuple[str, ...], data: st.DataObject
) -> None:
    event = data.draw(records(kind))
    (writer,) = (w for w in REGISTRY.writers() if w.origin == f"history/{kind.__name__}.v1.avsc")
    record = mapper_for(kind).to_avro(event)
    for name in dropped:
        del record[name]
    body = io.BytesIO()
    schemaless_writer(body, writer.schema, record)

    decoded = avro.decode_event(MAGIC + writer.fingerprint + body.getvalue())

    assert decoded == dataclasses.replace(event, **dict.fromkeys(dropped))  # type: ignore[arg-type]
