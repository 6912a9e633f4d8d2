"""The ``undecodable`` and ``refused`` families keep only their newest records (fold version 7).

A record that does not decode, and an event refused for an id that cannot key a timeline, are
kept with their raw bytes so an operator can see what a producer wrote; but a buggy or hostile
producer can write them at any rate, and every node, API and CLI replica and the ``<ns>.state``
changelog would keep them all. So each of the two families holds the newest ``POISON_KEPT``
records of its partition: after any offset, exactly the newest ``POISON_KEPT`` of those at or
below it, however the records were batched. The oldest go by ordinary deletes in the batch's
WriteBatch (changelog tombstones); records of a batch already past the bound are never written.
The tallies still count every undecodable record; older ones are on the events log (from their
offset) or in an archive.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from evsched.adapters.index.keys import REFUSED, U64, UNDECODABLE

# Records kept per family and partition. Enough to see what a bad producer writes and since
# when (its first records are on the log: the oldest kept offset says where to look), few enough
# that the worst case stays a bounded, stated size: this many times the events topic's
# max.message.bytes (1 MiB by default), per family, partition and copy of the index.
POISON_KEPT = 1_000
POISON_FAMILIES = (UNDECODABLE, REFUSED)
_END = b"\xff" * 9  # above every key of these families (8-byte offsets)


class PoisonTarget(Protocol):
    """What of the index the bound reads and writes through."""

    def h(self, name: str) -> Any: ...

    def ranges(self, name: str) -> Callable[[bytes, bytes], Iterator[bytes]]: ...


@dataclass(frozen=True, slots=True)
class Kept:
    """What one family holds: how many records, and an offset no record of it is below."""

    count: int
    low: int


class PoisonBound:
    """Keeps each poison family of one index at its newest ``kept`` records.

    What each family holds is counted once (when first written after an open or a load: at
    most ``kept`` keys), then followed in memory. Deletes always take the oldest keys, so the
    tombstones all lie below ``Kept.low`` and a trim never steps over them. Only keys are read:
    a value may be as large as a record of the events topic.
    """

    def __init__(self, index: PoisonTarget, kept: int = POISON_KEPT) -> None:
        self._index = index
        self._kept = kept
        self._known: dict[str, Kept] | None = None  # None: to count (opened, or loaded)

    def forget(self) -> None:
        """The families were written around the bound (a changelog's load): count again."""
        self._known = None

    def write(
        self, wb: Any, records: Mapping[str, Sequence[tuple[int, bytes]]]
    ) -> list[Callable[[], None]]:
        """Put each family's ``records`` (offset, value; above every stored offset, in log
        order) into ``wb`` and delete the oldest stored ones past the bound; the returned calls
        make the bound's counts what the index holds once ``wb`` is applied."""
        return [self._write(wb, family, found) for family, found in records.items() if found]

    def _write(
        self, wb: Any, family: str, records: Sequence[tuple[int, bytes]]
    ) -> Callable[[], None]:
        known = self._count()[family]
        fresh = dict(records)  # one record per offset; a repeat within the batch overwrites
        new = sorted(fresh)[-self._kept :]
        excess = known.count + len(new) - self._kept
        low = known.low
        if excess > 0:
            handle = self._index.h(family)
            stored = self._index.ranges(family)(U64.pack(low), _END)
            for key in itertools.islice(stored, excess):
                wb.delete(key, handle)
                low = int(U64.unpack(key)[0]) + 1
        for offset in new:
            wb.put(U64.pack(offset), fresh[offset], self._index.h(family))
        after = Kept(min(self._kept, known.count + len(new)), low)
        return lambda: self._set(family, after)

    def _set(self, family: str, kept: Kept) -> None:
        if self._known is not None:
            self._known[family] = kept

    def _count(self) -> dict[str, Kept]:
        if self._known is None:
            self._known = {family: self._counted(family) for family in POISON_FAMILIES}
        return self._known

    def _counted(self, family: str) -> Kept:
        count, low = 0, None
        for key in self._index.ranges(family)(b"", _END):
            count += 1
            low = int(U64.unpack(key)[0]) if low is None else low
        return Kept(count, 0 if low is None else low)
