"""The ``tallies`` family of the index: a partition's lifetime counts of what its fold judged.

Key: the tally's name (``core.tallies.NAMES``); value: its count, 8 B big-endian. A batch adds
its counts to the stored ones in the WriteBatch that carries its applied offset, so the counts
are a projection of the log like every other family: in the digest, mirrored by the changelog,
equal after a rebuild. Purges delete jobs, never a count.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from evsched.adapters.index.keys import U64

TALLIES = "tallies"


def add_tallies(
    stored: Callable[[bytes], bytes | None], wb: Any, handle: Any, counts: Mapping[str, int]
) -> None:
    """Put each tally of ``counts`` into ``wb`` (a Recorder) as its stored count plus the count."""
    for name, count in counts.items():
        key = name.encode()
        raw = stored(key)
        total = count + (0 if raw is None else int(U64.unpack(raw)[0]))
        wb.put(key, U64.pack(total), handle)


def read_tallies(items: Iterable[tuple[bytes, bytes]]) -> dict[str, int]:
    """The tallies of the family's ``items``, by name (a tally never counted is absent)."""
    return {key.decode(): int(U64.unpack(value)[0]) for key, value in items}
