"""Records folded into an index in chosen batches, for the index's unit tests."""

from __future__ import annotations

import itertools
from pathlib import Path

from evsched.adapters.index.store import PartitionIndex
from evsched.ports import Record
from evsched.runtime.projection.projector import Projector


def folded(
    path: Path, records: list[Record], cuts: list[int], opened: list[PartitionIndex]
) -> PartitionIndex:
    """``records`` folded into a fresh index, one batch between each two of ``cuts``."""
    index = PartitionIndex(path, 0)
    opened.append(index)
    fold_into(index, records, cuts)
    return index


def fold_into(index: PartitionIndex, records: list[Record], cuts: list[int]) -> None:
    projector = Projector(index)
    for start, end in itertools.pairwise([0, *cuts, len(records)]):
        if end > start:
            projector.commit(projector.fold(records[start:end]))
