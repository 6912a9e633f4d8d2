"""Compiles a parsed Avro record schema into a function that reads one dataclass like fastavro.

The generated code (``reader_source`` shows it) accepts only the canonical encoding of each value:
one block per array or map, varints of at most ten bytes, booleans 0 or 1, union and enum indexes
in range. It raises :class:`~evsched.adapters.avro.binary.Unusual`, or whatever error the bytes
provoke, for anything else, which the codec then hands to fastavro to read or reject.
"""

from __future__ import annotations

import dataclasses
import enum
import types
from collections.abc import Callable
from typing import Any, get_args, get_origin, get_type_hints

from evsched.adapters.avro import binary
from evsched.adapters.avro.codegen import (
    Function,
    Reader,
    Unsupported,
    identifier,
    kind_of,
    optional_branch,
    resolve,
)


def _hint_args(hint: Any, origin: Any) -> tuple[Any, ...]:
    if get_origin(hint) is not origin:
        raise Unsupported(f"{hint} does not match the schema")
    return get_args(hint)


class _ReaderCompiler:
    """Emits code reading one value at ``d[p:]`` into the local ``target``, advancing ``p``."""

    def __init__(self, schema: dict[str, Any], fn: Function) -> None:
        self._named: dict[str, Any] = schema.get("__named_schemas", {})
        self._fn = fn

    def value(self, depth: int, schema: Any, hint: Any, target: str) -> None:
        schema = resolve(self._named, schema)
        kind = kind_of(schema)
        emit = getattr(self, f"_{kind}", None)
        if emit is None:
            raise Unsupported(f"Avro type {kind!r} is not compiled")
        emit(depth, schema, hint, target)

    def _long(self, depth: int, schema: Any, hint: Any, target: str) -> None:
        byte = self._fn.local("b")
        self._fn.line(depth, f"{byte} = d[p]")
        self._fn.line(depth, f"if {byte} < 128: {target} = _ZIGZAG[{byte}]; p += 1")
        self._fn.line(depth, "elif d[p + 1] < 128:")
        self._fn.line(depth + 1, f"{byte} = {byte} & 127 | d[p + 1] << 7; p += 2")
        self._fn.line(depth + 1, f"{target} = ({byte} >> 1) ^ -({byte} & 1)")
        self._fn.line(depth, f"else: {target}, p = _read_long(d, p)")

    def _size(self, depth: int, target: str) -> None:
        """A length or block count: non-negative, else Unusual."""
        self._fn.line(depth, f"{target} = d[p]")
        self._fn.line(depth, f"if {target} < 128 and not {target} & 1: {target} >>= 1; p += 1")
        self._fn.line(depth, f"else: {target}, p = _read_size(d, p)")

    def _blob(self, depth: int, target: str, suffix: str) -> None:
        n = self._fn.local("n")
        self._size(depth, n)
        self._fn.line(depth, f"{n} += p")
        self._fn.line(depth, f"if {n} > end: raise Unusual")  # fastavro would read short
        self._fn.line(depth, f"{target} = d[p:{n}]{suffix}; p = {n}")

    def _string(self, depth: int, schema: Any, hint: Any, target: str) -> None:
        self._blob(depth, target, ".decode()")

    def _bytes(self, depth: int, schema: Any, hint: Any, target: str) -> None:
        self._blob(depth, target, "")

    def _boolean(self, depth: int, schema: Any, hint: Any, target: str) -> None:
        self._fn.line(depth, f"{target} = _BOOLEANS[d[p]]; p += 1")  # 2..255: IndexError

    def _double(self, depth: int, schema: Any, hint: Any, target: str) -> None:
        self._fn.line(depth, f"({target},) = _unpack_double(d, p); p += 8")

    def _enum(self, depth: int, schema: Any, hint: Any, target: str) -> None:
        symbols = schema["symbols"]
        members = tuple(hint(s) if isinstance(hint, enum.EnumMeta) else s for s in symbols)
        index = self._fn.local("i")
        self._long(depth, "long", int, index)
        self._fn.line(depth, f"if {index} < 0: raise Unusual")  # fastavro would count from the end
        self._fn.line(depth, f"{target} = {self._fn.const(members)}[{index}]")

    def _union(self, depth: int, schema: Any, hint: Any, target: str) -> None:
        branch = optional_branch(schema)
        (present,) = (arg for arg in _hint_args(hint, types.UnionType) if arg is not type(None))
        index = self._fn.local("b")
        self._fn.line(depth, f"{index} = d[p]; p += 1")
        self._fn.line(depth, f"if {index} == 0: {target} = None")
        self._fn.line(depth, f"elif {index} != 2: raise Unusual")
        self._fn.line(depth, "else:")
        self.value(depth + 1, branch, present, target)

    def _blocks(self, depth: int, read_item: Callable[[int], None]) -> None:
        """One block of items (``read_item`` emits the reading of one), then the end marker."""
        count = self._fn.local("n")
        self._size(depth, count)
        self._fn.line(depth, f"if {count}:")
        self._fn.line(depth + 1, f"if {count} > end - p: raise Unusual")
        self._fn.line(depth + 1, f"for _ in range({count}):")
        read_item(depth + 2)
        self._fn.line(depth + 1, "if d[p]: raise Unusual")  # a second block
        self._fn.line(depth + 1, "p += 1")

    def _array(self, depth: int, schema: Any, hint: Any, target: str) -> None:
        item_hint, *_ = _hint_args(hint, tuple)
        out, item = self._fn.local("a"), self._fn.local()

        def read_item(at: int) -> None:
            self.value(at, schema["items"], item_hint, item)
            self._fn.line(at, f"{out}.append({item})")

        self._fn.line(depth, f"{out} = []")
        self._blocks(depth, read_item)
        self._fn.line(depth, f"{target} = tuple({out})")

    def _map(self, depth: int, schema: Any, hint: Any, target: str) -> None:
        _, value_hint = _hint_args(hint, dict)
        out, key, item = self._fn.local("m"), self._fn.local(), self._fn.local()

        def read_item(at: int) -> None:
            self._string(at, "string", str, key)
            self.value(at, schema["values"], value_hint, item)
            self._fn.line(at, f"{out}[{key}] = {item}")

        self._fn.line(depth, f"{out} = {{}}")
        self._blocks(depth, read_item)
        self._fn.line(depth, f"{target} = {out}")

    def _record(self, depth: int, schema: Any, hint: Any, target: str) -> None:
        hints = _record_hints(schema, hint)
        values = []
        for field in schema["fields"]:
            name = identifier(field["name"])
            values.append((name, self._fn.local()))
            self.value(depth, field["type"], hints[name], values[-1][1])
        self._construct(depth, hint, values, target)

    def _construct(
        self, depth: int, cls: type[Any], values: list[tuple[str, str]], target: str
    ) -> None:
        # A frozen dataclass's __init__ only sets its slots; setting them directly is 2x faster.
        self._fn.line(depth, f"{target} = _new({self._fn.const(cls)})")
        for name, var in values:
            setter = self._fn.const(getattr(cls, name).__set__)
            self._fn.line(depth, f"{setter}({target}, {var})")


def _record_hints(schema: dict[str, Any], cls: Any) -> dict[str, Any]:
    """The field types of ``cls``, a plain slotted dataclass with the schema's fields."""
    if not (dataclasses.is_dataclass(cls) and isinstance(cls, type)):
        raise Unsupported(f"{cls} is not a dataclass")
    fields = dataclasses.fields(cls)
    if {f.name for f in fields} != {f["name"] for f in schema["fields"]}:
        raise Unsupported(f"{cls.__name__} and its schema have different fields")
    if (
        hasattr(cls, "__post_init__")
        or not hasattr(cls, "__slots__")
        or not all(f.init for f in fields)
    ):
        raise Unsupported(f"{cls.__name__} must be slotted with no __post_init__ to be compiled")
    return get_type_hints(cls)


def _reader_function(schema: dict[str, Any], cls: type[Any]) -> Function:
    if kind_of(schema) != "record":
        raise Unsupported("only records are compiled")
    env = {
        "_ZIGZAG": binary.ZIGZAG,
        "_BOOLEANS": (False, True),
        "_read_long": binary.read_long,
        "_read_size": binary.read_size,
        "_unpack_double": binary.unpack_double,
        "_new": object.__new__,
    }
    fn = Function("def read(d, p):", env)
    fn.line(1, "end = len(d)")
    _ReaderCompiler(schema, fn).value(1, schema, cls, "value")
    fn.line(1, "if p != end: raise Unusual")  # trailing bytes: fastavro words the error
    fn.line(1, "return value")
    return fn


def compile_reader(schema: dict[str, Any], cls: type[Any]) -> Reader:
    """Reads ``data[pos:]``, which must hold exactly one canonical encoding, as a ``cls``."""
    read: Reader = _reader_function(schema, cls).build("read", str(schema["name"]))
    return read


def reader_source(schema: dict[str, Any], cls: type[Any]) -> str:
    """The generated code of :func:`compile_reader`, to read or debug it."""
    return _reader_function(schema, cls).source()
