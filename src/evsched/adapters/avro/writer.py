"""Compiles a parsed Avro record schema into a function that writes one dataclass like fastavro.

The generated code (``writer_source`` shows it) appends each field's encoding to a bytearray. It
takes the values the dataclass declares. Where fastavro validates (inside a union branch) it
demands the exact builtin types and raises otherwise, so it never writes a value fastavro would
refuse; the codec then asks fastavro. Map entries are sorted and -0.0 becomes 0.0, as
``avro.mapping`` does before fastavro writes.
"""

from __future__ import annotations

from typing import Any

from evsched.adapters.avro import binary
from evsched.adapters.avro.codegen import (
    Function,
    Unsupported,
    Writer,
    identifier,
    kind_of,
    optional_branch,
    resolve,
)


class _WriterCompiler:
    """Emits code appending the encoding of ``expr`` to the bytearray ``o``."""

    def __init__(self, schema: dict[str, Any], fn: Function) -> None:
        self._named: dict[str, Any] = schema.get("__named_schemas", {})
        self._fn = fn

    def value(self, depth: int, schema: Any, expr: str, strict: bool) -> None:
        schema = resolve(self._named, schema)
        kind = kind_of(schema)
        emit = getattr(self, f"_{kind}", None)
        if emit is None:
            raise Unsupported(f"Avro type {kind!r} is not compiled")
        emit(depth, schema, expr, strict)

    def _bind(self, depth: int, expr: str, exact: type[Any] | None) -> str:
        """A local holding ``expr`` (itself if it is one), checked to be of type ``exact``."""
        var = expr
        if not expr.isidentifier():
            var = self._fn.local()
            self._fn.line(depth, f"{var} = {expr}")
        if exact is not None:
            self._fn.line(depth, f"if {var}.__class__ is not {exact.__name__}: raise Unusual")
        return var

    def _long(self, depth: int, schema: Any, expr: str, strict: bool) -> None:
        x, z = self._bind(depth, expr, int if strict else None), self._fn.local()
        self._fn.line(depth, f"{z} = ({x} << 1) ^ ({x} >> 63)")
        # Up to 42 bits inline, which covers times in epoch milliseconds until 2039.
        self._fn.line(depth, f"if {z} < {1 << 14}: o += _LAST[{z}]")
        self._fn.line(depth, f"elif {z} < {1 << 28}:")
        self._fn.line(depth + 1, f"o += _MORE[{z} & 16383]; o += _LAST[{z} >> 14]")
        self._fn.line(depth, f"elif {z} < {1 << 42}:")
        self._fn.line(depth + 1, f"o += _MORE[{z} & 16383]; o += _MORE[{z} >> 14 & 16383]")
        self._fn.line(depth + 1, f"o += _LAST[{z} >> 28]")
        self._fn.line(depth, f"else: o += _big({z})")

    def _blob(self, depth: int, var: str) -> None:
        n = self._fn.local()
        self._fn.line(depth, f"{n} = len({var})")
        short = binary.SHORT_LENGTH
        self._fn.line(depth, f"o += _LENGTH[{n}] if {n} < {short} else _big({n} << 1)")
        self._fn.line(depth, f"o += {var}")

    def _string(self, depth: int, schema: Any, expr: str, strict: bool) -> None:
        if strict:
            expr = self._bind(depth, expr, str)
        x = self._fn.local()
        self._fn.line(depth, f"{x} = {expr}.encode()")
        self._blob(depth, x)

    def _bytes(self, depth: int, schema: Any, expr: str, strict: bool) -> None:
        # Exact even where fastavro is lenient: len() of another buffer may count items, not bytes.
        self._blob(depth, self._bind(depth, expr, bytes))

    def _boolean(self, depth: int, schema: Any, expr: str, strict: bool) -> None:
        x = self._bind(depth, expr, bool if strict else None)
        self._fn.line(depth, f"o += b'\\x01' if {x} else b'\\x00'")

    def _double(self, depth: int, schema: Any, expr: str, strict: bool) -> None:
        x = self._bind(depth, expr, float if strict else None)
        self._fn.line(depth, f"o += _pack_double({x} + 0.0)")  # -0.0 becomes 0.0

    def _enum(self, depth: int, schema: Any, expr: str, strict: bool) -> None:
        indexes = {symbol: binary.LAST[2 * i] for i, symbol in enumerate(schema["symbols"])}
        self._fn.line(depth, f"o += {self._fn.const(indexes)}[{expr}]")

    def _record(self, depth: int, schema: Any, expr: str, strict: bool) -> None:
        r = self._bind(depth, expr, None)
        for field in schema["fields"]:
            self.value(depth, field["type"], f"{r}.{identifier(field['name'])}", strict)

    def _union(self, depth: int, schema: Any, expr: str, strict: bool) -> None:
        branch = optional_branch(schema)
        if kind_of(resolve(self._named, branch)) in {"array", "map"}:
            raise Unsupported("arrays and maps inside unions are not compiled")
        x = self._bind(depth, expr, None)
        self._fn.line(depth, f"if {x} is None: o += b'\\x00'")
        self._fn.line(depth, "else:")
        self._fn.line(depth + 1, "o += b'\\x02'")
        self.value(depth + 1, branch, x, strict=True)  # fastavro validates union branches

    def _count(self, depth: int, sized: str) -> None:
        """Opens ``if n:`` with the item count of ``sized`` written (len() raises for None)."""
        n = self._fn.local()
        self._fn.line(depth, f"{n} = len({sized})")
        self._fn.line(depth, f"if {n}:")
        short = binary.SHORT_LENGTH
        self._fn.line(depth + 1, f"o += _LENGTH[{n}] if {n} < {short} else _big({n} << 1)")

    def _array(self, depth: int, schema: Any, expr: str, strict: bool) -> None:
        x, item = self._bind(depth, expr, None), self._fn.local()
        self._count(depth, x)
        loop = depth + 1
        if kind_of(resolve(self._named, schema["items"])) == "string":
            # Ids all at once when they allow it (binary.ascii_strings), else one by one.
            joined = self._fn.local()
            self._fn.line(loop, f"{joined} = _ascii_strings({x})")
            self._fn.line(loop, f"if {joined} is not None: o += {joined}")
            self._fn.line(loop, "else:")
            loop += 1
        self._fn.line(loop, f"for {item} in {x}:")
        self.value(loop + 1, schema["items"], item, strict)
        self._fn.line(depth, "o += b'\\x00'")

    def _map(self, depth: int, schema: Any, expr: str, strict: bool) -> None:
        entries, key, item = self._fn.local(), self._fn.local(), self._fn.local()
        self._fn.line(depth, f"{entries} = {expr}.items()")
        self._count(depth, entries)
        # Sorted, as avro.mapping sorts, so that equal maps give equal bytes (one entry: no sort).
        ordered = f"{entries} if len({entries}) == 1 else sorted({entries})"
        self._fn.line(depth + 1, f"for {key}, {item} in {ordered}:")
        self._string(depth + 2, "string", key, strict)
        self.value(depth + 2, schema["values"], item, strict)
        self._fn.line(depth, "o += b'\\x00'")


def _writer_function(schema: dict[str, Any], prefix: bytes) -> Function:
    if kind_of(schema) != "record":
        raise Unsupported("only records are compiled")
    env = {
        "_LAST": binary.LAST,
        "_MORE": binary.MORE,
        "_LENGTH": binary.LENGTH,
        "_big": binary.big_varint,
        "_pack_double": binary.pack_double,
        "_ascii_strings": binary.ascii_strings,
        "_prefix": prefix,
    }
    fn = Function("def write(value):", env)
    fn.line(1, "o = bytearray(_prefix)")
    _WriterCompiler(schema, fn).value(1, schema, "value", strict=False)
    fn.line(1, "return bytes(o)")
    return fn


def compile_writer(schema: dict[str, Any], prefix: bytes = b"") -> Writer:
    """``prefix`` + the Avro body of a dataclass value of the parsed record ``schema``."""
    write: Writer = _writer_function(schema, prefix).build("write", str(schema["name"]))
    return write


def writer_source(schema: dict[str, Any]) -> str:
    """The generated code of :func:`compile_writer`, to read or debug it."""
    return _writer_function(schema, b"").source()
