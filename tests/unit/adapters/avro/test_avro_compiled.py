"""The compiled Avro writers and readers against fastavro, the reference, byte for byte.

For every record of the contract (current events, projections, dispatch): a compiled writer gives
exactly fastavro's bytes for any value, and a compiled reader, whenever it returns, returns what
fastavro and the mapper return for the same bytes, whatever the bytes. The codec falls back to
fastavro wherever a compiled function raises, so these two properties make it exact.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import io
import math
import struct
import types
from typing import Any, get_args, get_origin, get_type_hints

import pytest
from fastavro import schemaless_reader, schemaless_writer
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from evsched.adapters import avro
from evsched.adapters.avro.binary import big_varint, read_long
from evsched.adapters.avro.mapping import mapper_for
from evsched.adapters.avro.reader import compile_reader, reader_source
from evsched.adapters.avro.registry import MAGIC, SchemaRegistry, parse_contract_schema
from evsched.adapters.avro.writer import compile_writer, writer_source
from evsched.adapters.contract import load_schema_files
from evsched.core.dispatch import Dispatch
from evsched.core.events import EVENT_TYPES, JobEnqueued, JobLeased, RetryPolicy, TraceContext
from evsched.core.state import JobError, JobState, ScheduleState, Status, TimelineEntry
from evsched.errors import DecodeError, EncodeError
from tests.states import job_state

REGISTRY = SchemaRegistry.from_contract()
PROJECTIONS = load_schema_files("projections")


def _contract() -> dict[type[Any], tuple[bytes, dict[str, Any]]]:
    """Every record class of the contract: its header (empty for projections) and parsed schema."""
    records: dict[type[Any], tuple[bytes, dict[str, Any]]] = {}
    for cls in EVENT_TYPES:
        current = REGISTRY.current(cls.__name__)
        records[cls] = (MAGIC + current.fingerprint, current.schema)
    for cls in (JobState, ScheduleState, TimelineEntry):
        schema = parse_contract_schema(PROJECTIONS[f"{cls.__name__}.avsc"], cls.__name__)
        records[cls] = (b"", schema)
    dispatch = load_schema_files("schemas", "dispatch")["dispatch/Dispatch.avsc"]
    records[Dispatch] = (avro._DISPATCH.header, parse_contract_schema(dispatch, "Dispatch"))
    return records


RECORDS = _contract()
WRITERS = {cls: compile_writer(schema, header) for cls, (header, schema) in RECORDS.items()}
READERS = {cls: compile_reader(schema, cls) for cls, (_, schema) in RECORDS.items()}
SLOW = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _reference_write(cls: type[Any], value: Any) -> bytes:
    header, schema = RECORDS[cls]
    stream = io.BytesIO(header)
    stream.seek(len(header))
    schemaless_writer(stream, schema, mapper_for(cls).to_avro(value))
    return stream.getvalue()


def _reference_read(cls: type[Any], data: bytes) -> Any:
    header, schema = RECORDS[cls]
    stream = io.BytesIO(data)
    stream.seek(len(header))
    record = schemaless_reader(stream, schema, None)
    if stream.tell() != len(data):
        raise ValueError("trailing bytes")
    return mapper_for(cls).from_avro(record)


# --- values: wider than tests/strategies, to cross every length and varint boundary -----------

_LONG_EDGES = [
    sign * (1 << bits) + delta
    for bits in (6, 7, 13, 14, 20, 27, 28, 34, 41, 42, 48, 55, 56, 62)
    for sign in (1, -1)
    for delta in (-1, 0)
]
LONGS = st.one_of(
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.sampled_from([-(2**63), 2**63 - 1, *_LONG_EDGES]),
)
TEXTS = st.one_of(st.text(max_size=8), st.text(max_size=200), st.text("é€😀", max_size=40))
BLOBS = st.one_of(st.binary(max_size=8), st.binary(min_size=60, max_size=300))
# The elements of a long list: its count crosses the one-byte varint (63 -> 64 items), while
# long strings and bytes (past 63 bytes) are drawn in short lists and single fields. Long lists of
# long strings made a JobState of several such fields slow to draw, or too large for Hypothesis.
SHORT_TEXTS = st.text(max_size=4) | st.text("é€😀", max_size=2)
SHORT_BLOBS = st.binary(max_size=4)
DOUBLES = st.floats(allow_nan=False) | st.sampled_from([-0.0, math.inf, -math.inf, 5e-324])


def _tuples(element: Any, *, short: bool) -> st.SearchStrategy[tuple[Any, ...]]:
    """0-3 elements of any size, or (not inside a long list) 63-70 short ones."""
    few = st.lists(_strategy(element, short=short), max_size=3)
    if short:
        return few.map(tuple)
    many = st.lists(_strategy(element, short=True), min_size=63, max_size=70)
    return (few | many).map(tuple)


def _dicts(*, short: bool) -> st.SearchStrategy[dict[str, str]]:
    """0-3 entries of any size, or (not inside a long list) 63-70 short ones, distinct keys."""
    text = SHORT_TEXTS if short else TEXTS
    few = st.dictionaries(text, text, max_size=3)
    if short:
        return few
    many = st.lists(st.tuples(SHORT_TEXTS, SHORT_TEXTS), min_size=63, max_size=70)
    return few | many.map(lambda pairs: {f"{i}:{k}": v for i, (k, v) in enumerate(pairs)})


def _strategy(hint: Any, *, short: bool = False) -> st.SearchStrategy[Any]:
    origin = get_origin(hint)
    if origin is types.UnionType:
        (present,) = (arg for arg in get_args(hint) if arg is not types.NoneType)
        return st.none() | _strategy(present, short=short)
    if origin is dict:
        return _dicts(short=short)
    if origin is tuple:
        return _tuples(get_args(hint)[0], short=short)
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return st.sampled_from(hint)
    if dataclasses.is_dataclass(hint):
        return values(hint, short=short)  # type: ignore[arg-type]
    texts, blobs = (SHORT_TEXTS, SHORT_BLOBS) if short else (TEXTS, BLOBS)
    simple = {str: texts, bytes: blobs, bool: st.booleans(), int: LONGS, float: DOUBLES}
    return simple[hint]


def values(cls: type[Any], *, short: bool = False) -> st.SearchStrategy[Any]:
    hints = get_type_hints(cls)
    fields = {f.name: _strategy(hints[f.name], short=short) for f in dataclasses.fields(cls)}
    return st.builds(cls, **fields)


def _bits(value: Any) -> Any:
    """``value`` with floats as their bits and types kept, so NaN and -0.0 compare exactly."""
    if isinstance(value, float):
        return (float, struct.pack("<d", value))
    if dataclasses.is_dataclass(value):
        return (type(value), *(_bits(getattr(value, f.name)) for f in dataclasses.fields(value)))
    if isinstance(value, tuple | list):
        return (type(value), *map(_bits, value))
    if isinstance(value, dict):  # equal dicts are equal in any order
        return (dict, *sorted((k, _bits(v)) for k, v in value.items()))
    return (type(value), value)


# --- every record compiles, and the codec uses the compiled functions -------------------------


def test_every_contract_record_compiles_and_the_codec_uses_it() -> None:
    assert set(RECORDS) == {*EVENT_TYPES, JobState, ScheduleState, TimelineEntry, Dispatch}
    for cls, (_, schema) in RECORDS.items():
        assert "def write(value):" in writer_source(schema)
        assert "def read(d, p):" in reader_source(schema, cls)
    codecs = [*avro._EVENTS._write_plans.values(), avro._JOB_STATE.write_plan, avro._DISPATCH]
    assert all(plan.fast is not avro._refuse_write for plan in codecs)
    assert avro._refuse_read not in avro._EVENTS._fast_reads.values()


# --- writers --------------------------------------------------------------------------------


@pytest.mark.parametrize("cls", list(RECORDS), ids=lambda cls: cls.__name__)
@SLOW
@given(data=st.data())
def test_compiled_writer_bytes_equal_fastavro_bytes(cls: type[Any], data: st.DataObject) -> None:
    value = data.draw(values(cls))
    encoded = WRITERS[cls](value)

    assert encoded == _reference_write(cls, value)
    assert READERS[cls](encoded, len(RECORDS[cls][0])) == value  # -0.0 == 0.0: no NaN is drawn


def test_long_strings_maps_and_arrays_take_the_multi_byte_length_paths() -> None:
    text = "é" * 5000  # 10,000 bytes: a length beyond the 8,192 of the table
    state = dataclasses.replace(
        _job_state(),
        job_id=text,
        args=bytes(70_000),
        labels={f"k{i:05}": "v" for i in range(9000)},
        recent_event_ids=tuple(map(str, range(9000))),
    )
    encoded = WRITERS[JobState](state)

    assert encoded == _reference_write(JobState, state)
    assert READERS[JobState](encoded, 0) == state


@pytest.mark.parametrize(
    "ids",
    [
        ("4bf92f35-77b3-4da6-a3ce-929d0e0e4736", "00f067aa-0ba9-42b7-8c1e-6a4c1e2f0d11"),
        ("", ""),  # one length, zero: every prefix is 0x00
        ("é1", "é2"),  # one length, not ASCII: written one by one
        ("a" * 63, "b" * 63),  # the longest whose prefix is one byte
        ("a" * 64, "b" * 64),  # a two-byte prefix: written one by one
        ("e-1", "e-22"),  # lengths differ: written one by one
        ("e\udc80", "e\udc81"),  # not encodable: fastavro's refusal
    ],
)
def test_arrays_of_ids_are_written_all_at_once_like_fastavro(ids: tuple[str, ...]) -> None:
    state = dataclasses.replace(_job_state(), recent_event_ids=ids, children=ids[:1])
    try:
        reference = _reference_write(JobState, state)
    except Exception:  # whatever fastavro raises, the codec refuses too
        with pytest.raises(EncodeError):
            avro.encode_state(state)
        return

    assert WRITERS[JobState](state) == reference
    assert avro.encode_state(state) == reference
    assert READERS[JobState](reference, 0) == state


@pytest.mark.parametrize("value", [-(2**63), 2**63 - 1, *_LONG_EDGES])
def test_every_long_boundary_encodes_like_fastavro(value: int) -> None:
    state = dataclasses.replace(_job_state(), run_at=value, lease_until=value, token=value)

    assert WRITERS[JobState](state) == _reference_write(JobState, state)
    assert READERS[JobState](WRITERS[JobState](state), 0) == state


def test_big_varint_refuses_what_is_not_a_long() -> None:
    with pytest.raises(OverflowError):
        big_varint(1 << 64)


# Anything, to put where a field's declared type belongs.
ANYTHING = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=2**63 - 2, max_value=2**66),
    st.floats(),
    st.text(max_size=4),
    st.binary(max_size=4),
    st.binary(max_size=4).map(bytearray),
    st.lists(st.text(max_size=2), max_size=2),
    st.tuples(st.integers()),
    st.dictionaries(st.text(max_size=2), st.text(max_size=2) | st.integers(), max_size=2),
    st.sampled_from([Status.DEAD, "dead", RetryPolicy(), TraceContext(traceparent="t")]),
    st.just(JobError(error_type="E", message="m", retryable=True)),
)
ILL_TYPED_NESTED = st.one_of(
    st.builds(JobError, error_type=ANYTHING, message=st.just("m"), retryable=ANYTHING),
    st.builds(TraceContext, traceparent=ANYTHING, tracestate=ANYTHING),
    st.builds(RetryPolicy, initial_backoff_ms=ANYTHING, multiplier=ANYTHING),
)


@pytest.mark.parametrize("cls", [JobState, JobEnqueued, TimelineEntry], ids=lambda c: c.__name__)
@SLOW
@given(data=st.data())
def test_a_compiled_writer_never_accepts_what_fastavro_would_write_otherwise(
    cls: type[Any], data: st.DataObject
) -> None:
    """Ill-typed values: the compiled writer raises (then fastavro decides) or agrees with it."""
    value = data.draw(values(cls))
    name = data.draw(st.sampled_from([f.name for f in dataclasses.fields(cls)]))
    odd = dataclasses.replace(value, **{name: data.draw(ANYTHING | ILL_TYPED_NESTED)})
    try:
        fast = WRITERS[cls](odd)
    except Exception:  # any refusal is fine: the codec then asks fastavro
        return
    assert fast == _reference_write(cls, odd)


def test_the_codec_encodes_what_only_fastavro_accepts_as_fastavro_does() -> None:
    odd = dataclasses.replace(_job_state(), priority=2.0)  # type: ignore[arg-type]

    assert avro.encode_job_state(odd) == _reference_write(JobState, odd)
    with pytest.raises(EncodeError):
        avro.encode_job_state(dataclasses.replace(_job_state(), lease_until=True))


# --- readers --------------------------------------------------------------------------------


def _fast_or_none(cls: type[Any], data: bytes) -> tuple[bool, Any]:
    try:
        return True, READERS[cls](data, len(RECORDS[cls][0]))
    except Exception:  # a refusal: the codec then asks fastavro
        return False, None


def _assert_agrees_with_fastavro(cls: type[Any], data: bytes) -> None:
    read, value = _fast_or_none(cls, data)
    if read:
        assert _bits(value) == _bits(_reference_read(cls, data))


@st.composite
def _mutated(draw: st.DrawFn, cls: type[Any]) -> bytes:
    encoded = bytearray(WRITERS[cls](draw(values(cls))))
    for _ in range(draw(st.integers(1, 4))):
        at = draw(st.integers(len(RECORDS[cls][0]), len(encoded)))
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


@pytest.mark.parametrize("cls", list(RECORDS), ids=lambda cls: cls.__name__)
@SLOW
@given(data=st.data())
def test_whatever_a_compiled_reader_returns_fastavro_returns_too(
    cls: type[Any], data: st.DataObject
) -> None:
    header = RECORDS[cls][0]
    raw = header + data.draw(st.binary(max_size=80))
    _assert_agrees_with_fastavro(cls, raw)
    _assert_agrees_with_fastavro(cls, data.draw(_mutated(cls)))


def _leased_body(**overrides: bytes) -> bytes:
    """A JobLeased body built field by field, so a test can write one field non-canonically."""
    fields = {
        "event_id": b"\x02e",
        "job_id": b"\x02j",
        "emitted_at": b"\x02",
        "source": b"\x02s",
        "token": b"\x04",
        "attempt": b"\x02",
        "lease_ms": b"\xd0\x0f",
        "trace": b"\x00",
        "not_before": b"\x00",
    }
    return b"".join({**fields, **overrides}.values())


@pytest.mark.parametrize(
    "field, encoding",
    [
        ("token", b"\x84\x00"),  # an overlong varint for 2
        ("token", b"\x84\x80\x80\x80\x80\x80\x80\x80\x80\x00"),  # ten bytes
        ("trace", b"\x01\x02t\x00"),  # union index -1, which fastavro takes as the last branch
        ("attempt", b"\x03"),  # attempt -2: a value, not an encoding, fastavro accepts
    ],
)
def test_non_canonical_encodings_decode_as_fastavro_decodes_them(
    field: str, encoding: bytes
) -> None:
    data = RECORDS[JobLeased][0] + _leased_body(**{field: encoding})

    _assert_agrees_with_fastavro(JobLeased, data)  # the compiled reader agrees, or refuses ...
    assert avro.decode_event(data) == _reference_read(JobLeased, data)  # ... and fastavro reads it


def test_multi_block_maps_and_arrays_are_read_by_fastavro() -> None:
    state = dataclasses.replace(_job_state(), labels={"a": "1", "b": "2"}, recent_event_ids=("x",))
    canonical = WRITERS[JobState](state)
    one_block = b"\x04\x02a\x021\x02b\x022\x00"
    # The second block has a negative count (-1) followed by its size in bytes (4).
    two_blocks = b"\x02\x02a\x021\x01\x08\x02b\x022\x00"
    data = canonical.replace(one_block, two_blocks)

    assert not _fast_or_none(JobState, data)[0]
    assert avro.decode_job_state(data) == state


def test_read_long_leaves_varints_beyond_64_bits_to_fastavro() -> None:
    with pytest.raises(Exception, match="ten bytes"):
        read_long(b"\x80" * 10 + b"\x01", 0)
    with pytest.raises(Exception, match="64 bits"):
        read_long(b"\xff" * 9 + b"\x7f", 0)
    assert read_long(b"\xfe" + b"\xff" * 8 + b"\x01", 0) == (2**63 - 1, 10)


@given(data=st.binary(max_size=40))
@example(data=b"")
def test_the_codec_still_raises_only_decode_error(data: bytes) -> None:
    for decode in (avro.decode_event, avro.decode_job_state, avro.decode_dispatch):
        with contextlib.suppress(DecodeError):
            decode(data)


def test_a_memoryview_still_decodes_through_fastavro() -> None:
    encoded = avro.encode_event(_enqueued())

    assert avro.decode_event(memoryview(encoded)) == _enqueued()  # type: ignore[arg-type]


# --- helpers ----------------------------------------------------------------------------------


def _job_state() -> JobState:
    return job_state(
        status=Status.RUNNING,
        run_at=1_767_225_600_000,
        timeout_ms=300_000,
        enqueued_at=1_767_225_600_000,
        updated_at=1_767_225_600_001,
    )


def _enqueued() -> JobEnqueued:
    return JobEnqueued(
        event_id="e-1",
        job_id="j-1",
        emitted_at=1_767_225_600_000,
        source="api",
        task="t",
        queue="q",
        args=b"{}",
        labels={"team": "a"},
    )
