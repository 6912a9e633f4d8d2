"""The shared pieces of the compiled Avro writers and readers: generated functions, schema lookups.

``avro.writer`` and ``avro.reader`` walk a parsed record schema once, at import time, and emit
straight-line Python for it, which fastavro would otherwise interpret for every value. The codec
(the package's ``__init__``) takes nothing on trust: it uses these functions as a fast path whose
every result is property-tested to equal fastavro's, byte for byte, and falls back to fastavro
whenever they raise.

Only what the contract uses is compiled: null, boolean, long, double, string, bytes, enum, record,
array, map and ``["null", X]`` unions; anything else raises :class:`Unsupported`.
"""

from __future__ import annotations

import keyword
from collections.abc import Callable
from typing import Any

from evsched.adapters.avro import binary

Writer = Callable[[Any], bytes]
Reader = Callable[[bytes, int], Any]


class Unsupported(Exception):
    """A schema this compiler does not specialise."""


def kind_of(schema: Any) -> str:
    if isinstance(schema, list):
        return "union"
    if isinstance(schema, dict):
        return str(schema["type"])
    return str(schema)


def identifier(name: Any) -> str:
    if not isinstance(name, str) or not name.isidentifier() or keyword.iskeyword(name):
        raise Unsupported(f"field name {name!r} is not a Python identifier")
    return name


def resolve(named: dict[str, Any], schema: Any) -> Any:
    """A schema, with a reference to a named type replaced by that type's definition."""
    return named.get(schema, schema) if isinstance(schema, str) else schema


def optional_branch(schema: list[Any]) -> Any:
    if len(schema) != 2 or schema[0] != "null" or schema[1] == "null":
        raise Unsupported(f"only [null, X] unions are compiled, not {schema}")
    return schema[1]


class Function:
    """The lines of one generated function and the objects its code refers to by name."""

    def __init__(self, header: str, env: dict[str, Any]) -> None:
        self.lines = [header]
        self.env = {"Unusual": binary.Unusual, **env}
        self._count = 0

    def local(self, prefix: str = "v") -> str:
        self._count += 1
        return f"{prefix}{self._count}"

    def const(self, value: Any) -> str:
        name = self.local("k")
        self.env[name] = value
        return name

    def line(self, depth: int, text: str) -> None:
        self.lines.append("    " * depth + text)

    def source(self) -> str:
        return "\n".join(self.lines) + "\n"

    def build(self, name: str, record: str) -> Callable[..., Any]:
        """The function ``name``; tracebacks and profiles show it as ``<avro {name} {record}>``."""
        namespace = dict(self.env)
        code = compile(self.source(), f"<avro {name} {record}>", "exec")
        exec(code, namespace)  # noqa: S102
        function: Callable[..., Any] = namespace[name]
        return function
