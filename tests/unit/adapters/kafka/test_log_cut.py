"""``log_cut``: the text of ``--until``/``as_of`` parsed, and resolved against a partition log's
offsets and log times (a twin of the consumer's answers; the broker's own are tested in
``tests/integration/test_as_of.py``)."""

from __future__ import annotations

from collections.abc import Collection

import pytest

from evsched.adapters.kafka.log_cut import (
    AtOffsets,
    AtTime,
    CutError,
    parse_cut,
    resolve_cut,
)

T0 = 1_765_000_000_000  # 2025-12-06T05:46:40Z


class Logs:
    """Per partition: the log time of each kept offset (from ``start``), read_committed."""

    def __init__(self, times: dict[int, list[int]], starts: dict[int, int] | None = None) -> None:
        self.times = times
        self.starts = starts or dict.fromkeys(times, 0)

    async def start_offsets(self, partitions: Collection[int]) -> dict[int, int]:
        return {p: self.starts[p] for p in partitions}

    async def end_offsets(self, partitions: Collection[int]) -> dict[int, int]:
        return {p: self.starts[p] + len(self.times[p]) for p in partitions}

    async def offsets_after(
        self, partitions: Collection[int], at_ms: int
    ) -> dict[int, tuple[int, int] | None]:
        found: dict[int, tuple[int, int] | None] = {}
        for p in partitions:
            later = [(self.starts[p] + i, t) for i, t in enumerate(self.times[p]) if t > at_ms]
            found[p] = later[0] if later else None
        return found


def test_parses_times_offsets_and_one_offset() -> None:
    assert parse_cut("2025-12-06T05:46:40Z") == AtTime(T0)
    assert parse_cut(" 2025-12-06T06:46:40.5+01:00 ") == AtTime(T0 + 500)
    assert parse_cut("12") == AtOffsets(every=12)
    assert parse_cut("-1") == AtOffsets(every=-1)
    assert parse_cut("1:7,0:-1") == AtOffsets(offsets=((0, -1), (1, 7)))
    assert str(AtTime(T0)) == "2025-12-06T05:46:40.000+00:00"
    assert str(parse_cut("1:7,0:-1")) == "0:-1,1:7"


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("yesterday", "neither an RFC 3339 time"),
        ("", "neither an RFC 3339 time"),
        ("2025-12-06T05:46:40", "no time zone"),
        ("-2", "out of range"),
        ("0:1,0:2", "named twice"),
        ("0:1,", "neither"),
        ("9" * 19, "out of range"),
        ("x" * 2_001, "longer than 2000"),
    ],
)
def test_refuses_text_naming_no_point(text: str, says: str) -> None:
    with pytest.raises(CutError, match=says):
        parse_cut(text)


async def test_a_time_folds_each_partition_up_to_its_last_record_appended_then() -> None:
    # Partitions' times interleave: each is cut by its own log times.
    logs = Logs({0: [T0 - 5, T0, T0 + 1], 1: [T0 + 3, T0 + 4], 2: [T0 - 9], 3: []})
    until = await resolve_cut(logs, [0, 1, 2, 3], AtTime(T0), now_ms=T0 + 10)
    assert until == {0: 1, 1: -1, 2: 0, 3: -1}


async def test_a_time_is_refused_in_the_future_or_before_retention() -> None:
    logs = Logs({0: [T0, T0 + 5]}, starts={0: 40})
    with pytest.raises(CutError, match="in the future"):
        await resolve_cut(logs, [0], AtTime(T0 + 11), now_ms=T0 + 10)
    with pytest.raises(CutError, match=r"before the retention start of partition 0.*offset 40"):
        await resolve_cut(logs, [0], AtTime(T0 - 1), now_ms=T0 + 10)
    # Before 1970 is before every record: nothing, or refused when records were deleted.
    with pytest.raises(CutError, match="retention start"):
        await resolve_cut(logs, [0], AtTime(-5), now_ms=T0 + 10)
    assert await resolve_cut(Logs({0: [T0]}), [0], AtTime(-5), now_ms=T0) == {0: -1}
    # At or after the first kept record: folded from the changelog's snapshot, then the log.
    assert await resolve_cut(logs, [0], AtTime(T0), now_ms=T0 + 10) == {0: 40}


async def test_offsets_must_name_every_partition_within_its_end() -> None:
    logs = Logs({0: [T0] * 3, 1: [T0] * 5})
    assert await resolve_cut(logs, [0, 1], AtOffsets(every=2), now_ms=T0) == {0: 2, 1: 2}
    named = AtOffsets(offsets=((0, -1), (1, 4)))
    assert await resolve_cut(logs, [0, 1], named, now_ms=T0) == {0: -1, 1: 4}
    with pytest.raises(CutError, match="offset 3 of partition 0 is past its end"):
        await resolve_cut(logs, [0, 1], AtOffsets(every=3), now_ms=T0)
    with pytest.raises(CutError, match=r"name every partition .*0 to 1.*not \[0\]"):
        await resolve_cut(logs, [0, 1], AtOffsets(offsets=((0, 1),)), now_ms=T0)
