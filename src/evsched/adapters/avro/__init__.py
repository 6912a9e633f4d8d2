"""The Avro codec: events in single-object encoding, projection records as plain Avro bodies.

Old writer schemas are resolved to the current ones here, so the core only ever sees current event
types. Nothing but :class:`~evsched.errors.DecodeError` escapes a decode, whatever the bytes.

fastavro is the reference. Current-schema records go first through functions compiled from their
schemas (``avro.writer``, ``avro.reader``), several times faster; whenever one of those refuses a
value or bytes, fastavro writes or reads them instead, so results never differ from fastavro's
(``tests/unit/adapters/avro/test_avro_compiled.py`` proves it byte for byte).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from io import BytesIO
from typing import Any, Generic, TypeVar, cast

from fastavro import schemaless_reader, schemaless_writer

from evsched.adapters.avro.binary import Unusual
from evsched.adapters.avro.codegen import Reader, Unsupported, Writer
from evsched.adapters.avro.mapping import RecordMapper, mapper_for
from evsched.adapters.avro.reader import compile_reader
from evsched.adapters.avro.registry import (
    HEADER_SIZE,
    MAGIC,
    ParsedSchema,
    SchemaRegistry,
    parse_contract_schema,
    schema_fingerprint,
)
from evsched.adapters.avro.writer import compile_writer
from evsched.adapters.contract import load_schema_files
from evsched.core.controls import ControlState
from evsched.core.dispatch import Dispatch
from evsched.core.events import EVENT_TYPES, Event
from evsched.core.permits import LimitState
from evsched.core.state import JobState, ScheduleState, TimelineEntry
from evsched.errors import ContractError, DecodeError, EncodeError

T = TypeVar("T")
StateT = TypeVar("StateT", JobState, ScheduleState, ControlState, LimitState)

PROJECTION_NAMESPACE = "evsched.projections"
DISPATCH_NAMESPACE = "evsched.dispatch"
_MAX_REASON = 200


def _write(prefix: bytes, schema: ParsedSchema, record: dict[str, Any]) -> bytes:
    stream = BytesIO()
    stream.write(prefix)
    schemaless_writer(stream, schema, record)
    return stream.getvalue()


def _read(data: bytes, start: int, writer: ParsedSchema, reader: ParsedSchema | None) -> Any:
    stream = BytesIO(data)
    stream.seek(start)
    record = schemaless_reader(stream, writer, reader)
    trailing = len(data) - stream.tell()
    if trailing:
        raise DecodeError(f"{trailing} trailing bytes after the record")
    return record


def _refuse_write(value: Any) -> bytes:
    raise Unusual("no compiled writer")


def _refuse_read(data: bytes, start: int) -> Any:
    raise Unusual("no compiled reader")


def _fast_writer(schema: ParsedSchema, prefix: bytes) -> Writer:
    """The compiled writer of ``schema``, or one that always leaves the value to fastavro."""
    try:
        return compile_writer(schema, prefix)
    except Unsupported:
        return _refuse_write


def _fast_reader(schema: ParsedSchema, cls: type[Any]) -> Reader:
    """The compiled reader of ``schema``, or one that always leaves the bytes to fastavro."""
    try:
        return compile_reader(schema, cls)
    except Unsupported:
        return _refuse_read


# fastavro names its stream in some messages ("cannot read double from <_io.BytesIO object at
# 0x7f...>"): an address would make the reason, and so the index digest, differ between two folds.
_OBJECT_REPR = re.compile(r"<[^<>]* at 0x[0-9A-Fa-f]+>")


def _decode_reason(exc: Exception) -> str:
    """Why bytes did not decode, as a pure function of the bytes (stored, and digested)."""
    detail = _OBJECT_REPR.sub("the record", str(exc))
    if isinstance(exc, EOFError):
        return f"truncated: {detail or 'the record ends early'}"[:_MAX_REASON]
    return f"invalid record: {type(exc).__name__}: {detail}"[:_MAX_REASON]


@dataclass(frozen=True, slots=True)
class _WritePlan:
    name: str
    header: bytes
    schema: ParsedSchema
    mapper: RecordMapper[Any]
    # header + body, equal to what fastavro writes; it raises for what it leaves to fastavro.
    fast: Writer

    def encode(self, value: Any) -> bytes:
        try:
            return self.fast(value)
        except Exception:  # noqa: S110 - fastavro writes the value, or says why it can't
            pass
        return self.encode_with_fastavro(value)

    def encode_with_fastavro(self, value: Any) -> bytes:
        try:
            return _write(self.header, self.schema, self.mapper.to_avro(value))
        except Exception as exc:  # fastavro reports bad values with assorted types
            raise EncodeError(f"{self.name}: {type(exc).__name__}: {exc}") from exc


def _write_plan(header: bytes, schema: ParsedSchema, cls: type[Any]) -> _WritePlan:
    return _WritePlan(cls.__name__, header, schema, mapper_for(cls), _fast_writer(schema, header))


@dataclass(frozen=True, slots=True)
class _ReadPlan:
    writer: ParsedSchema
    # None when the writer schema is the current one: nothing to resolve, and fastavro is faster.
    reader: ParsedSchema | None
    mapper: RecordMapper[Any]


class EventCodec:
    """Encodes events with their current schema; decodes any schema the registry knows."""

    def __init__(self, registry: SchemaRegistry) -> None:
        classes = {cls.__name__: cls for cls in EVENT_TYPES}
        if registry.kinds != classes.keys():
            unmatched = sorted(registry.kinds ^ classes.keys())
            raise ContractError(f"event kinds and schemas differ: {unmatched}")
        self._write_plans = {
            cls: _write_plan(
                MAGIC + registry.current(kind).fingerprint, registry.current(kind).schema, cls
            )
            for kind, cls in classes.items()
        }
        # By the whole header (magic and fingerprint) of the current schemas.
        self._fast_reads = {
            MAGIC + writer.fingerprint: _fast_reader(writer.schema, classes[writer.kind])
            for writer in registry.writers()
            if writer.current
        }
        self._read_plans = {
            writer.fingerprint: _ReadPlan(
                writer=writer.schema,
                reader=None if writer.current else registry.current(writer.kind).schema,
                mapper=mapper_for(classes[writer.kind]),
            )
            for writer in registry.writers()
        }

    def encode(self, event: Event) -> bytes:
        plan = self._write_plans.get(type(event))
        if plan is None:
            raise EncodeError(f"not an event type: {type(event).__name__}")
        return plan.encode(event)

    def decode(self, data: bytes) -> Event:
        if data.__class__ is bytes:
            read = self._fast_reads.get(data[:HEADER_SIZE])
            if read is not None:
                try:
                    event: Event = read(data, HEADER_SIZE)
                except Exception:  # noqa: S110 - fastavro reads the bytes, or says what is wrong
                    pass
                else:
                    return event
        return self._decode_with_fastavro(data)

    def _decode_with_fastavro(self, data: bytes) -> Event:
        try:
            if data[:2] != MAGIC:
                raise DecodeError(f"bad magic {bytes(data[:2]).hex()!r}: not single-object Avro")
            if len(data) < HEADER_SIZE:
                raise DecodeError(f"truncated header: {len(data)} bytes")
            plan = self._read_plans.get(data[2:HEADER_SIZE])
            if plan is None:
                raise DecodeError(f"unknown writer schema fingerprint {data[2:HEADER_SIZE].hex()}")
            event: Event = plan.mapper.from_avro(_read(data, HEADER_SIZE, plan.writer, plan.reader))
        except DecodeError:
            raise
        except Exception as exc:  # anything the bytes provoke must surface as a DecodeError
            raise DecodeError(_decode_reason(exc)) from exc
        return event


class RecordCodec(Generic[T]):
    """A projection record type as a plain Avro body: its bytes are equal iff the values are."""

    def __init__(self, cls: type[T], schema: Any) -> None:
        if not isinstance(schema, dict) or schema.get("name") != cls.__name__:
            raise ContractError(f"the schema of {cls.__name__} is not a record of that name")
        self._schema = parse_contract_schema(schema, cls.__name__)
        self._mapper = mapper_for(cls)
        self.write_plan = _write_plan(b"", self._schema, cls)
        self._fast_read = _fast_reader(self._schema, cls)

    def encode(self, value: T) -> bytes:
        return self.write_plan.encode(value)

    def decode(self, data: bytes) -> T:
        if data.__class__ is bytes:
            try:
                value: T = self._fast_read(data, 0)
            except Exception:  # noqa: S110 - fastavro reads the bytes, or says what is wrong
                pass
            else:
                return value
        try:
            return self._mapper.from_avro(_read(data, 0, self._schema, None))
        except DecodeError:
            raise
        except Exception as exc:  # a corrupt index value must not crash its reader
            raise DecodeError(_decode_reason(exc)) from exc


def _projection_codec(cls: type[T], schemas: dict[str, Any]) -> RecordCodec[T]:
    schema = schemas.get(f"{cls.__name__}.avsc")
    if not isinstance(schema, dict) or schema.get("namespace") != PROJECTION_NAMESPACE:
        raise ContractError(f"projections/{cls.__name__}.avsc: no {PROJECTION_NAMESPACE} record")
    return RecordCodec(cls, schema)


_EVENTS = EventCodec(SchemaRegistry.from_contract())
_PROJECTIONS = load_schema_files("projections")
_JOB_STATE = _projection_codec(JobState, _PROJECTIONS)
_SCHEDULE_STATE = _projection_codec(ScheduleState, _PROJECTIONS)
_TIMELINE = _projection_codec(TimelineEntry, _PROJECTIONS)
_STATES: dict[type[Any], RecordCodec[Any]] = {
    JobState: _JOB_STATE,
    ScheduleState: _SCHEDULE_STATE,
    ControlState: _projection_codec(ControlState, _PROJECTIONS),
    LimitState: _projection_codec(LimitState, _PROJECTIONS),
}
# encode_state runs once per folded event: one lookup straight to the write plan.
_STATE_PLANS = {cls: codec.write_plan for cls, codec in _STATES.items()}


def encode_event(event: Event) -> bytes:
    """``C3 01`` + the current schema's 8-byte fingerprint + the Avro body; raises EncodeError."""
    return _EVENTS.encode(event)


def decode_event(data: bytes) -> Event:
    """The event in ``data``, upgraded to the current type; raises only DecodeError."""
    return _EVENTS.decode(data)


def encode_job_state(state: JobState) -> bytes:
    """The value stored in column family ``jobs``."""
    return _JOB_STATE.encode(state)


def decode_job_state(data: bytes) -> JobState:
    """A stored ``jobs`` value; raises only DecodeError."""
    return _JOB_STATE.decode(data)


def encode_schedule_state(state: ScheduleState) -> bytes:
    """The value stored in column family ``schedules``."""
    return _SCHEDULE_STATE.encode(state)


def decode_schedule_state(data: bytes) -> ScheduleState:
    """A stored ``schedules`` value; raises only DecodeError."""
    return _SCHEDULE_STATE.decode(data)


def encode_state(state: JobState | ScheduleState | ControlState | LimitState) -> bytes:
    """``encode_job_state``, ``encode_schedule_state`` or a control's, by the type of ``state``."""
    plan = _STATE_PLANS.get(type(state))
    if plan is None:
        raise EncodeError(f"not a state type: {type(state).__name__}")
    try:  # plan.encode, inlined: this runs once per folded event
        return plan.fast(state)
    except Exception:  # noqa: S110 - fastavro writes the value, or says why it can't
        pass
    return plan.encode_with_fastavro(state)


def decode_state(data: bytes, kind: type[StateT]) -> StateT:
    """``decode_job_state`` (kind=JobState), ``decode_schedule_state`` (ScheduleState), or a
    ControlState."""
    return cast(StateT, _STATES[kind].decode(data))


def encode_timeline(entry: TimelineEntry) -> bytes:
    """The value stored in column family ``timeline``."""
    return _TIMELINE.encode(entry)


def decode_timeline(data: bytes) -> TimelineEntry:
    """A stored ``timeline`` value; raises only DecodeError."""
    return _TIMELINE.decode(data)


# --- dispatch records: <ns>.dispatch.<queue>, single-object encoded like events -----------------


def _dispatch_plan() -> _WritePlan:
    schema = load_schema_files("schemas", "dispatch").get("dispatch/Dispatch.avsc")
    if not isinstance(schema, dict) or schema.get("namespace") != DISPATCH_NAMESPACE:
        raise ContractError(f"schemas/dispatch/Dispatch.avsc: no {DISPATCH_NAMESPACE} record")
    parsed = parse_contract_schema(schema, "Dispatch.avsc")
    return _write_plan(MAGIC + schema_fingerprint(schema), parsed, Dispatch)


def _dispatch_history() -> dict[bytes, ParsedSchema]:
    """Older Dispatch schemas by header: records of nodes not yet upgraded still decode."""
    found = load_schema_files("schemas", "dispatch/history")
    return {
        MAGIC + schema_fingerprint(schema): parse_contract_schema(schema, path)
        for path, schema in found.items()
    }


_DISPATCH = _dispatch_plan()
_DISPATCH_READ = _fast_reader(_DISPATCH.schema, Dispatch)
_DISPATCH_OLD = _dispatch_history()


def encode_dispatch(dispatch: Dispatch) -> bytes:
    """``C3 01`` + the Dispatch schema's fingerprint + the Avro body; raises EncodeError."""
    return _DISPATCH.encode(dispatch)


def decode_dispatch(data: bytes) -> Dispatch:
    """The dispatch record in ``data``; raises only DecodeError."""
    if data.__class__ is bytes and data[:HEADER_SIZE] == _DISPATCH.header:
        try:
            fast: Dispatch = _DISPATCH_READ(data, HEADER_SIZE)
        except Exception:  # noqa: S110 - fastavro reads the bytes, or says what is wrong
            pass
        else:
            return fast
    try:
        header = bytes(data[:HEADER_SIZE])
        writer = _DISPATCH.schema if header == _DISPATCH.header else _DISPATCH_OLD.get(header)
        if writer is None:
            raise DecodeError(f"not a Dispatch record: header {header.hex()}")
        reader = None if writer is _DISPATCH.schema else _DISPATCH.schema
        dispatch: Dispatch = _DISPATCH.mapper.from_avro(_read(data, HEADER_SIZE, writer, reader))
    except DecodeError:
        raise
    except Exception as exc:  # anything the bytes provoke must surface as a DecodeError
        raise DecodeError(_decode_reason(exc)) from exc
    return dispatch
