"""The recorder's check of the bound on undecodable and refused records (``replay/poison_check``),
offline: an index folded from a flood, whole or up to a prefix (as a node that stopped early),
passes; an index that keeps other offsets than the newest fails, naming them."""

from __future__ import annotations

from pathlib import Path

import pytest
from replay.record import kept, recorded

from evsched.adapters.archive.history_file import LoggedEvent
from evsched.adapters.index.poison import POISON_KEPT
from evsched.adapters.index.store import PartitionIndex
from evsched.operator.replay import fold_history
from evsched.ports import Record
from evsched.runtime.projection.projector import Projector
from replay import poison_check
from tests.integration.test_retention_poison import flood

RECORDS = [
    Record("t.events", 1, offset, 1_000 + offset, b"k", value)
    for offset, (_, value) in enumerate(flood(POISON_KEPT + 10))
]


def index_of(path: Path, records: list[Record]) -> PartitionIndex:
    index = PartitionIndex(path, 1)
    projector = Projector(index)
    for start in range(0, len(records), 333):
        projector.commit(projector.fold(records[start : start + 333]))
    return index


def test_an_index_at_any_offset_keeps_what_the_check_wants(tmp_path: Path) -> None:
    outcome = fold_history([LoggedEvent.from_record(r) for r in RECORDS])
    assert (
        len(poison_check.refused_offsets(outcome)) == len(outcome.undecodable) == len(RECORDS) // 2
    )
    for name, end in (("prefix", 1_200), ("all", len(RECORDS))):
        index = index_of(tmp_path / name, RECORDS[:end])
        try:
            kept_now = poison_check.check_poison(index, outcome, name)
            assert kept_now == min(end, 2 * POISON_KEPT)
            for key, rows in outcome.jobs.items():  # what the recorder compares per id
                assert kept(recorded(index, key, schedule=False), rows), key
        finally:
            index.close()


def test_an_index_that_keeps_other_offsets_fails_the_check(tmp_path: Path) -> None:
    index = index_of(tmp_path / "p", RECORDS)
    try:
        shorter = fold_history([LoggedEvent.from_record(r) for r in RECORDS[:-4]])
        with pytest.raises(AssertionError, match="undecodable keeps 1000 records"):
            poison_check.check_poison(index, shorter, "p1")  # as if the index ran ahead
    finally:
        index.close()
