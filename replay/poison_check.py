"""What an index keeps of the fold's undecodable and refused records (fold version 7): the newest
``POISON_KEPT`` of each kind on its partition, at or below the offset it applied.

The recorder checks that every index of a run (the replica's, each node's) holds exactly those,
so a history with more than that many shows the bound at work on every copy of the index.
"""

from __future__ import annotations

from evsched.adapters.index.keys import REFUSED, U64, UNDECODABLE
from evsched.adapters.index.poison import POISON_KEPT
from evsched.adapters.index.store import PartitionIndex, keyable
from evsched.operator.replay import Outcome


def refused_offsets(outcome: Outcome) -> list[tuple[int, int]]:
    """(partition, offset) of every event refused for an id that cannot key a timeline."""
    found: list[tuple[int, int]] = []
    named = [(key, rows) for key, rows in (*outcome.jobs.items(), *outcome.schedules.items())]
    # A pause switch is keyed "<target> <name> p<partition>", a limit "limit <name> p<partition>".
    named += [
        (key.split(" ", 1)[1].rsplit(" ", 1)[0], rows) for key, rows in outcome.controls.items()
    ]
    named += [
        (key.split(" ", 1)[1].rsplit(" ", 1)[0], rows) for key, rows in outcome.limits.items()
    ]
    for name, rows in named:
        if not keyable(name):
            found += [(int(row[0]), int(row[1])) for row in rows]
    return sorted(found)


def kept_poison(outcome: Outcome, partition: int, applied: int) -> dict[str, list[int]]:
    """The offsets each family of ``partition``'s index must hold once it applied ``applied``."""
    undecodable = sorted((int(p), int(o)) for p, o in outcome.undecodable)
    return {
        family: [o for p, o in found if p == partition and o <= applied][-POISON_KEPT:]
        for family, found in ((UNDECODABLE, undecodable), (REFUSED, refused_offsets(outcome)))
    }


def check_poison(index: PartitionIndex, outcome: Outcome, where: str) -> int:
    """Assert ``index`` keeps exactly the newest of each kind; how many entries it keeps."""
    wanted = kept_poison(outcome, index.partition, index.applied_offset())
    for family, offsets in wanted.items():
        got = [int(U64.unpack(key)[0]) for key, _ in index.scan(family)]
        assert got == offsets, (
            f"{where}: {family} keeps {len(got)} records (offsets {got[:1]}..{got[-1:]}), "
            f"the newest {POISON_KEPT} of the fold are {len(offsets)} "
            f"(offsets {offsets[:1]}..{offsets[-1:]})"
        )
    return sum(len(offsets) for offsets in wanted.values())
