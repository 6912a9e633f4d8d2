"""A point of the events log to fold up to: a last offset per partition, or a time mapped to them.

The text (``evsched rebuild --until``, the API's ``as_of``) is one of: an RFC 3339 time with a
zone (``2026-12-07T14:02:00Z``); ``P:OFFSET,...`` naming every partition's last offset to fold
(inclusive, -1 for none); or one OFFSET for every partition. A time maps to each partition's
first offset whose LogAppendTime is after it (the events topic is LogAppendTime): the cut folds
every record the broker appended at or before that millisecond, partition by partition.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Protocol

from evsched.errors import EvschedError

_OFFSET = re.compile(r"-?[0-9]{1,19}")
_OFFSETS = re.compile(r"[0-9]{1,6}:-?[0-9]{1,19}(,[0-9]{1,6}:-?[0-9]{1,19})*")
MAX_CUT_CHARS = 2_000


class CutError(EvschedError, ValueError):
    """The text names no point of the log, or one that cannot be folded to (the message says)."""


@dataclass(frozen=True, slots=True)
class AtTime:
    """Every record appended at or before ``at_ms`` (epoch ms, the broker's LogAppendTime)."""

    at_ms: int

    def __str__(self) -> str:
        return datetime.fromtimestamp(self.at_ms / 1000, UTC).isoformat(timespec="milliseconds")


@dataclass(frozen=True, slots=True)
class AtOffsets:
    """Offsets up to these (inclusive): one for every partition (``every``) or one each."""

    every: int | None = None
    offsets: tuple[tuple[int, int], ...] = ()

    def __str__(self) -> str:
        if self.every is not None:
            return str(self.every)
        return ",".join(f"{p}:{o}" for p, o in self.offsets)


Cut = AtTime | AtOffsets


def parse_cut(text: str) -> Cut:
    """The cut ``text`` names; CutError (saying what is accepted) when it names none."""
    text = text.strip()
    if len(text) > MAX_CUT_CHARS:
        raise CutError(f"longer than {MAX_CUT_CHARS} characters")
    if _OFFSET.fullmatch(text):
        return AtOffsets(every=_offset(int(text)))
    if _OFFSETS.fullmatch(text):
        pairs = [item.split(":") for item in text.split(",")]
        offsets = {int(p): _offset(int(o)) for p, o in pairs}
        if len(offsets) != len(pairs):
            raise CutError("a partition is named twice")
        return AtOffsets(offsets=tuple(sorted(offsets.items())))
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise CutError(
            f"{text[:80]!r} is neither an RFC 3339 time (2026-12-07T14:02:00Z), "
            "P:OFFSET,... nor an OFFSET"
        ) from None
    if when.tzinfo is None:
        raise CutError(f"{text[:80]!r} has no time zone: add Z or an offset such as +01:00")
    return AtTime(round(when.timestamp() * 1000))


def _offset(offset: int) -> int:
    if not -1 <= offset < 2**63:
        raise CutError(f"offset {offset} is out of range (-1 for none, else 0 or more)")
    return offset


class Positions(Protocol):
    """What resolving a cut asks of a reader of the events topic."""

    async def start_offsets(self, partitions: Collection[int]) -> dict[int, int]: ...

    async def end_offsets(self, partitions: Collection[int]) -> dict[int, int]: ...

    async def offsets_after(
        self, partitions: Collection[int], at_ms: int
    ) -> dict[int, tuple[int, int] | None]:
        """Per partition, the first record appended after ``at_ms``: (offset, log time), or
        None when there is none."""
        ...


async def resolve_cut(
    log: Positions, partitions: Sequence[int], cut: Cut, *, now_ms: int
) -> dict[int, int]:
    """Each partition's last offset to fold (inclusive; -1: none), read_committed.

    CutError for a time after ``now_ms``, a time before a partition's first kept record
    (retention deleted what came before), an offset past a partition's end, or offsets that do
    not name exactly the topic's partitions.
    """
    ends = await log.end_offsets(partitions)
    if isinstance(cut, AtOffsets):
        return _named(cut, ends)
    if cut.at_ms > now_ms:
        raise CutError(f"{cut} is in the future (it is {AtTime(now_ms)})")
    after = await log.offsets_after(partitions, max(cut.at_ms, -1))  # no record is before 0
    starts = await log.start_offsets(partitions)
    until = {}
    for partition in partitions:
        found = after.get(partition)
        end = ends[partition] if found is None else min(found[0], ends[partition])
        start = starts[partition]
        if start > 0 and end <= start:
            first = found[1] if found is not None else None
            kept = "" if first is None else f", appended at {AtTime(first)}"
            raise CutError(
                f"{cut} is before the retention start of partition {partition}: the records "
                f"before its first kept offset {start}{kept} were deleted"
            )
        until[partition] = end - 1
    return until


def _named(cut: AtOffsets, ends: dict[int, int]) -> dict[int, int]:
    if cut.every is not None:
        until = dict.fromkeys(ends, cut.every)
    else:
        until = dict(cut.offsets)
        if set(until) != set(ends):
            raise CutError(
                f"name every partition of the topic once (0 to {len(ends) - 1}), "
                f"not {sorted(until)}"
            )
    for partition, offset in sorted(until.items()):
        if offset >= ends[partition]:
            raise CutError(
                f"offset {offset} of partition {partition} is past its end "
                f"(its last offset is {ends[partition] - 1})"
            )
    return until
