"""Maps the core's frozen dataclasses to the plain dicts fastavro reads and writes, and back.

The conversions are derived once per class from its type hints, so a field added to a core
dataclass needs no change here; per call only the fields that need converting are touched.
"""

from __future__ import annotations

import enum
import types
from collections.abc import Callable
from dataclasses import fields, is_dataclass
from typing import Any, Generic, TypeVar, cast, get_args, get_origin, get_type_hints

T = TypeVar("T")
Convert = Callable[[Any], Any]


def _sorted_map(value: dict[str, str]) -> dict[str, str]:
    # fastavro writes map entries in iteration order; sorting makes equal dicts equal bytes.
    return dict(sorted(value.items()))


def _plain_float(value: float) -> float:
    # -0.0 == 0.0 but the two encode differently; adding 0.0 turns -0.0 into 0.0.
    return value + 0.0


def _optional(convert: Convert) -> Convert:
    return lambda value: None if value is None else convert(value)


def _optional_inner(hint: Any) -> Any:
    present = [arg for arg in get_args(hint) if arg is not types.NoneType]
    if len(present) != 1:
        raise TypeError(f"only `X | None` unions map to Avro here, not {hint}")
    return present[0]


def _check_map(hint: Any) -> None:
    if get_args(hint) != (str, str):
        raise TypeError(f"only dict[str, str] maps to Avro here, not {hint}")


def _outgoing(hint: Any) -> Convert | None:
    """How a field's value becomes fastavro's datum; None where it already is one."""
    origin = get_origin(hint)
    if origin is types.UnionType:
        inner = _outgoing(_optional_inner(hint))
        return None if inner is None else _optional(inner)
    if origin is dict:
        _check_map(hint)
        return _sorted_map
    if origin is tuple:
        item = _outgoing(get_args(hint)[0])
        return list if item is None else lambda value: [item(x) for x in value]
    if hint is float:
        return _plain_float
    if is_dataclass(hint):
        return mapper_for(cast(type[Any], hint)).to_avro
    return None


def _incoming(hint: Any) -> Convert | None:
    """How fastavro's datum becomes the field's value; None where it already is one."""
    origin = get_origin(hint)
    if origin is types.UnionType:
        inner = _incoming(_optional_inner(hint))
        return None if inner is None else _optional(inner)
    if origin is tuple:
        item = _incoming(get_args(hint)[0])
        return tuple if item is None else lambda value: tuple(item(x) for x in value)
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return hint
    if is_dataclass(hint):
        return mapper_for(cast(type[Any], hint)).from_avro
    return None


def _converters(
    names: tuple[str, ...], hints: dict[str, Any], derive: Callable[[Any], Convert | None]
) -> tuple[tuple[str, Convert], ...]:
    pairs = ((name, derive(hints[name])) for name in names)
    return tuple((name, convert) for name, convert in pairs if convert is not None)


class RecordMapper(Generic[T]):
    """Converts one dataclass to and from the dict of its Avro record (same field names)."""

    __slots__ = ("_cls", "_incoming", "_names", "_outgoing")

    def __init__(self, cls: type[T]) -> None:
        hints = get_type_hints(cls)
        self._cls: Callable[..., T] = cls
        self._names = tuple(f.name for f in fields(cast(Any, cls)))
        self._outgoing = _converters(self._names, hints, _outgoing)
        self._incoming = _converters(self._names, hints, _incoming)

    def to_avro(self, value: T) -> dict[str, Any]:
        # Built by hand: dataclasses.asdict deep-copies and recurses, several times slower.
        record = {name: getattr(value, name) for name in self._names}
        for name, convert in self._outgoing:
            record[name] = convert(record[name])
        return record

    def from_avro(self, record: dict[str, Any]) -> T:
        for name, convert in self._incoming:
            record[name] = convert(record[name])
        return self._cls(**record)


_MAPPERS: dict[type[Any], RecordMapper[Any]] = {}


def mapper_for(cls: type[T]) -> RecordMapper[T]:
    """The mapper of a dataclass, built once per class."""
    mapper = _MAPPERS.get(cls)
    if mapper is None:
        mapper = _MAPPERS[cls] = RecordMapper(cls)
    return mapper
