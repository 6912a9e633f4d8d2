"""Task arguments, results, checkpoints and effects as canonical JSON bytes, and back."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# The deepest nesting the HTTP and CLI edges accept in args, kwargs and labels, and the deepest
# the API and CLI views render (what is deeper shows as not JSON): far above what any task needs,
# far below where recursive encoders (pydantic's serializer, json.dumps) give up.
MAX_JSON_DEPTH = 64


def deeper_than(value: Any, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether ``value`` nests lists and objects more than ``limit`` levels (the outer one is 1).

    Iterative, so a value nested far beyond the interpreter's recursion limit is measured too.
    """
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list | tuple):
            children = item
        else:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False


class NotJson(ValueError):
    """A value that has no canonical JSON form (an object, NaN, a non-string key...)."""


# One encoder for every call: ``json.dumps`` with options makes a new one each time.
_CANONICAL = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
)


def canonical_json(value: Any) -> bytes:
    """UTF-8 JSON with sorted keys and no spaces: equal values give equal bytes (and digests).

    NaN and infinities are refused: they are not JSON, and other languages could not read them.
    """
    try:
        text = _CANONICAL.encode(value)
    except (TypeError, ValueError) as exc:
        raise NotJson(str(exc)) from exc
    return text.encode()


NO_ARGS = canonical_json({"args": [], "kwargs": {}})


def encode_args(args: Sequence[Any], kwargs: Mapping[str, Any]) -> bytes:
    """``{"args": [...], "kwargs": {...}}`` as canonical JSON: the ``args`` of JobEnqueued."""
    if not args and not kwargs:  # a call without arguments, encoded once
        return NO_ARGS
    return canonical_json({"args": list(args), "kwargs": dict(kwargs)})


@dataclass(frozen=True, slots=True)
class Arguments:
    """Decoded task arguments."""

    args: tuple[Any, ...]
    kwargs: dict[str, Any]


def decode_args(data: bytes) -> Arguments:
    """The arguments in ``data``; raises NotJson when it is not an args document.

    JSON nested deeper than the interpreter can parse is NotJson too, not a RecursionError.
    """
    try:
        document = json.loads(data)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise NotJson(f"args are not UTF-8 JSON: {exc}") from exc
    if not isinstance(document, dict):
        raise NotJson("args must be a JSON object with 'args' and 'kwargs'")
    args = document.get("args", [])
    kwargs = document.get("kwargs", {})
    if not isinstance(args, list) or not isinstance(kwargs, dict):
        raise NotJson("'args' must be a JSON array and 'kwargs' a JSON object")
    return Arguments(tuple(args), kwargs)


def decode_json(data: bytes | None) -> Any:
    """A stored JSON value (a checkpoint), or None when there is none; raises NotJson."""
    if data is None:
        return None
    try:
        return json.loads(data)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise NotJson(f"not UTF-8 JSON: {exc}") from exc
