"""Paging through the indexes lazily: a stable order (partition, then id bytes), opaque cursors,
and a bound on the records one page may read, so a selective filter over a million jobs costs
one bounded slice per request instead of a full scan.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Annotated, Generic, TypeVar

from fastapi import Query

from evsched.api.errors import ApiError

T = TypeVar("T")
# The query parameter of every paged listing. Only a next_cursor this API returned decodes; the
# document can say its alphabet, not that: the format names it for clients and test generators.
CursorQuery = Annotated[
    str | None,
    Query(
        max_length=2_000,
        pattern=r"^[A-Za-z0-9_-]*$",
        description="The previous page's next_cursor, as is (an opaque base64url string); "
        "any other string is a 422 naming cursor.",
        json_schema_extra={"format": "evsched-cursor"},
    ),
]
# A partition's rows after an id (None: from its start), each with the id it is keyed by.
Rows = Callable[[int, str | None], Iterator[tuple[str, T]]]


@dataclass(frozen=True, slots=True)
class Cursor:
    """Where the next page starts: after ``after`` in ``partition`` (from its start when None)."""

    partition: int
    after: str | None = None

    def encode(self) -> str:
        raw = json.dumps([self.partition, self.after], separators=(",", ":")).encode()
        return base64.urlsafe_b64encode(raw).decode().rstrip("=")

    @classmethod
    def decode(cls, text: str) -> Cursor:
        try:
            raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
            partition, after = json.loads(raw)
        except (binascii.Error, ValueError, TypeError, RecursionError):
            raise _bad_cursor() from None
        valid_after = after is None or (isinstance(after, str) and _utf8(after))
        if not isinstance(partition, int) or isinstance(partition, bool) or not valid_after:
            raise _bad_cursor()
        return cls(partition, after)


def _utf8(text: str) -> bool:
    """Whether ``text`` is UTF-8 encodable: JSON lets a cursor carry a lone surrogate."""
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def _bad_cursor() -> ApiError:
    return ApiError(
        422,
        "validation_error",
        "not a cursor this API returned: pass next_cursor as is",
        field="cursor",
    )


@dataclass(frozen=True, slots=True)
class Page(Generic[T]):
    items: list[T]
    next_cursor: str | None
    scanned: int


def page(
    partitions: Sequence[int],
    rows: Rows[T],
    keep: Callable[[T], bool],
    *,
    cursor: Cursor | None,
    limit: int,
    max_scan: int,
) -> Page[T]:
    """Up to ``limit`` kept rows from ``cursor`` on, reading at most ``max_scan`` rows.

    A page cut short by ``max_scan`` has fewer items but still a cursor: keep paging until
    ``next_cursor`` is None.
    """
    items: list[T] = []
    scanned = 0
    start = cursor if cursor is not None else Cursor(partitions[0] if partitions else 0)
    for partition in partitions:
        if partition < start.partition:
            continue
        after = start.after if partition == start.partition else None
        for key, row in rows(partition, after):
            scanned += 1
            if keep(row):
                items.append(row)
            if len(items) >= limit or scanned >= max_scan:
                return Page(items, Cursor(partition, key).encode(), scanned)
    return Page(items, None, scanned)
