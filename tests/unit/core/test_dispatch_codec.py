"""Dispatch records round-trip in single-object encoding, and any other bytes are a DecodeError."""

from __future__ import annotations

import contextlib
import json
from dataclasses import replace

import pytest
from fastavro.schema import fingerprint, to_parsing_canonical_form
from hypothesis import given
from hypothesis import strategies as st

from evsched.adapters.avro import decode_dispatch, encode_dispatch, encode_event
from evsched.adapters.contract import contract_dir
from evsched.core.dispatch import (
    START_MARGIN_MS,
    Dispatch,
    start_deadline,
    start_deadline_by_log,
    why_not_start,
)
from evsched.core.events import JobCancelled, TraceContext
from evsched.errors import DecodeError, EncodeError

BASE = Dispatch(
    job_id="0b7f6c1e-2d7c-4a55-9a4e-0f1f3b2a9c10",
    token=7,
    attempt=2,
    max_attempts=5,
    task="billing.charge",
    queue="default",
    args=b'{"args":[1],"kwargs":{}}',
    timeout_ms=60_000,
    lease_ms=30_000,
    run_at=1_700_000_000_000,
    enqueued_at=1_699_999_999_000,
    leased_at=1_700_000_000_050,
    partition=4,
)
FULL = replace(
    BASE,
    checkpoint=b'{"page":3}',
    idempotency_key="order-42",
    trace=TraceContext(traceparent="00-" + "1" * 32 + "-" + "2" * 16 + "-01"),
)


@pytest.mark.parametrize("dispatch", [BASE, FULL], ids=["minimal", "full"])
def test_round_trip(dispatch: Dispatch) -> None:
    assert decode_dispatch(encode_dispatch(dispatch)) == dispatch


def test_header_is_single_object_encoding_with_the_schema_fingerprint() -> None:
    schema = json.loads((contract_dir("schemas") / "dispatch" / "Dispatch.avsc").read_text())
    expected = bytes.fromhex(fingerprint(to_parsing_canonical_form(schema), "CRC-64-AVRO"))

    data = encode_dispatch(BASE)

    assert schema["namespace"] == "evsched.dispatch"
    assert data[:2] == b"\xc3\x01"
    assert data[2:10] == expected


def test_an_event_is_not_a_dispatch() -> None:
    event = JobCancelled(event_id="e", job_id="j", emitted_at=1, source="client")
    with pytest.raises(DecodeError, match="not a Dispatch record"):
        decode_dispatch(encode_event(event))


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"", "not a Dispatch record"),
        (b"{}", "not a Dispatch record"),
        (encode_dispatch(BASE)[:-3], "truncated"),
        (encode_dispatch(BASE) + b"\x00", "trailing"),
    ],
    ids=["empty", "json", "truncated", "trailing"],
)
def test_bad_bytes_are_a_decode_error(data: bytes, reason: str) -> None:
    with pytest.raises(DecodeError, match=reason):
        decode_dispatch(data)


@given(st.binary(max_size=64))
def test_no_bytes_escape_as_another_error(data: bytes) -> None:
    with contextlib.suppress(DecodeError):
        decode_dispatch(data)


@given(st.binary(max_size=40))
def test_a_valid_header_with_garbage_body_is_a_decode_error_or_a_dispatch(tail: bytes) -> None:
    header = encode_dispatch(BASE)[:10]
    with contextlib.suppress(DecodeError):
        assert isinstance(decode_dispatch(header + tail), Dispatch)


def test_unencodable_values_are_an_encode_error() -> None:
    with pytest.raises(EncodeError, match="Dispatch"):
        encode_dispatch(replace(BASE, token=2**64))


# --- when a worker may start a dispatch (core/dispatch.py) --------------------------------------


def test_the_start_deadline_keeps_a_margin_of_a_second_or_a_quarter_of_short_leases() -> None:
    assert start_deadline(BASE) == BASE.leased_at + 30_000 - START_MARGIN_MS
    assert start_deadline(replace(BASE, lease_ms=400)) == BASE.leased_at + 300
    assert start_deadline_by_log(BASE) == BASE.leased_at + 30_000


@pytest.mark.parametrize(
    ("now_offset", "newest", "reason"),
    [
        (0, None, None),
        (29_000, None, None),
        (29_001, None, "expired"),
        (0, 6, None),
        (0, 7, "duplicate"),
        (0, 8, "superseded"),
        (29_001, 8, "superseded"),
    ],
)
def test_why_not_start(now_offset: int, newest: int | None, reason: str | None) -> None:
    now = BASE.leased_at + now_offset
    assert why_not_start(BASE, now_ms=now, newest_token=newest) == reason
