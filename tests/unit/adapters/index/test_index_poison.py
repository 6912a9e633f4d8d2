"""The index keeps the newest ``POISON_KEPT`` undecodable and refused records of a partition (fold
version 7), on a real RocksDB: the same keys and digest one record at a time, in one batch, across
batch boundaries, and after a restore from the mirrored families; the tallies count every one.
"""

from __future__ import annotations

import itertools
from pathlib import Path

from evsched.adapters import avro
from evsched.adapters.index.keys import REFUSED, U64, UNDECODABLE
from evsched.adapters.index.poison import POISON_KEPT
from evsched.adapters.index.store import PartitionIndex
from evsched.api import undecodable
from evsched.core import tallies
from evsched.core.events import JobEnqueued
from evsched.core.fold import FOLD_VERSION
from evsched.operator.commands import undecodable as operator_undecodable
from evsched.ports import Record
from evsched.runtime.projection.projector import Projector
from tests.unit.index_folds import fold_into, folded

EXTRA = 7
GARBAGE = b"\x00garbage"


def refused_event(n: int) -> bytes:
    """An enqueue whose job id (empty) cannot key a timeline: kept in ``refused``."""
    return avro.encode_event(
        JobEnqueued(
            event_id=f"r{n}", job_id="", emitted_at=0, source="forger", task="t", queue="q",
            args=b"[]",
        )
    )  # fmt: skip


def good_event(n: int) -> bytes:
    return avro.encode_event(
        JobEnqueued(
            event_id=f"g{n}", job_id=f"job-{n}", emitted_at=0, source="client", task="t",
            queue="q", args=b"[]",
        )
    )  # fmt: skip


def log_of(values: list[bytes]) -> list[Record]:
    return [Record("t.events", 0, i, 1_000 + i, b"k", v) for i, v in enumerate(values)]


def mixed_log(count: int) -> list[Record]:
    """``count`` garbage records and ``count`` refused events, interleaved with valid ones."""
    values: list[bytes] = []
    for n in range(count):
        values += [GARBAGE, refused_event(n)]
        if n % 100 == 0:
            values.append(good_event(n))
    return log_of(values)


def offsets(index: PartitionIndex, family: str) -> list[int]:
    return [int(U64.unpack(key)[0]) for key, _ in index.scan(family)]


def kind(record: Record) -> str:
    if record.value == GARBAGE:
        return UNDECODABLE
    return REFUSED if record.value is not None and b"forger" in record.value else "other"


def newest(records: list[Record], family: str, upto: int | None = None) -> list[int]:
    """The offsets ``family`` should hold: the newest ``POISON_KEPT`` of its records."""
    found = [r.offset for r in records if kind(r) == family and (upto is None or r.offset <= upto)]
    return found[-POISON_KEPT:]


def test_each_family_keeps_exactly_its_newest_records_however_batched(
    tmp_path: Path, indexes: list[PartitionIndex]
) -> None:
    records = mixed_log(POISON_KEPT + EXTRA)
    one = folded(tmp_path / "one", records, list(range(1, len(records))), indexes)
    whole = folded(tmp_path / "whole", records, [], indexes)
    # A batch that fills the families, then one that crosses the bound, then small ones.
    crossing = folded(tmp_path / "cross", records, [POISON_KEPT, POISON_KEPT + 20], indexes)
    assert offsets(one, UNDECODABLE) == newest(records, UNDECODABLE)
    assert offsets(one, REFUSED) == newest(records, REFUSED)
    assert len(offsets(one, UNDECODABLE)) == len(offsets(one, REFUSED)) == POISON_KEPT
    assert whole.digest() == one.digest() == crossing.digest()
    assert one.tallies()[tallies.UNDECODABLE] == POISON_KEPT + EXTRA  # counted, every one
    assert one.job("job-1000") is not None  # the valid events around them are folded as ever
    oldest = one.undecodable()[0]
    assert oldest.offset == newest(records, UNDECODABLE)[0]


def test_every_prefix_holds_the_newest_at_or_below_it(
    tmp_path: Path, indexes: list[PartitionIndex]
) -> None:
    records = log_of([GARBAGE] * (POISON_KEPT + 3))
    index = folded(tmp_path / "p", records[: POISON_KEPT - 2], [], indexes)
    for end in range(POISON_KEPT - 2, len(records)):
        fold_into(index, records[end : end + 1], [])
        assert offsets(index, UNDECODABLE) == newest(records, UNDECODABLE, upto=end)


def test_a_batch_of_more_than_the_bound_writes_only_the_newest(
    tmp_path: Path, indexes: list[PartitionIndex]
) -> None:
    """The records of a batch already past the bound never reach the changelog either."""
    records = log_of([GARBAGE] * 5 + [GARBAGE] * (POISON_KEPT + EXTRA))
    index = folded(tmp_path / "p", records[:5], [], indexes)
    projector = Projector(index)
    batch = projector.fold(records[5:])
    prepared = projector.prepare(batch)
    assert prepared is not None
    changes = [(f, k, v) for f, k, v in prepared.changes if f == UNDECODABLE]
    assert sorted(int(U64.unpack(k)[0]) for f, k, v in changes if v is not None) == newest(
        records, UNDECODABLE
    )
    assert sorted(int(U64.unpack(k)[0]) for f, k, v in changes if v is None) == list(range(5))
    projector.commit(batch, prepared)
    assert offsets(index, UNDECODABLE) == newest(records, UNDECODABLE)


def test_a_dropped_batch_leaves_the_count_as_it_was(
    tmp_path: Path, indexes: list[PartitionIndex]
) -> None:
    """A batch prepared for a transaction that then aborts is never applied: the bound must
    count what the index holds, not what it was about to hold."""
    records = log_of([GARBAGE] * (POISON_KEPT + EXTRA))
    index = folded(tmp_path / "p", records[: POISON_KEPT - 1], [], indexes)
    projector = Projector(index)
    assert projector.prepare(projector.fold(records[POISON_KEPT - 1 :])) is not None  # dropped
    fold_into(index, records[POISON_KEPT - 1 :], [])  # a fresh projector folds them again
    assert offsets(index, UNDECODABLE) == newest(records, UNDECODABLE)


def test_a_restored_index_trims_like_the_one_it_was_restored_from(
    tmp_path: Path, indexes: list[PartitionIndex]
) -> None:
    """Restored from the changes as a changelog carries them (puts and tombstones, in chunks),
    and from the mirrored keys as a compacted one does: then both trim like the live index."""
    records = mixed_log(POISON_KEPT + 50)
    cut = len(records) - 30
    live = PartitionIndex(tmp_path / "live", 0)
    indexes.append(live)
    projector, written = Projector(live), []
    for start, end in itertools.pairwise((0, 700, 1_500, cut)):
        batch = projector.fold(records[start:end])
        prepared = projector.prepare(batch)
        assert prepared is not None
        written += prepared.changes
        projector.commit(batch, prepared)
    assert live.applied_offset() == cut - 1
    assert any(v is None for f, _, v in written if f == REFUSED)  # trims made tombstones
    for name, changes in (("log", written), ("compacted", list(live.mirrored()))):
        restored = PartitionIndex(tmp_path / name, 0)
        indexes.append(restored)
        half = len(changes) // 2
        restored.load(changes[:half])
        restored.load(changes[half:])
        restored.finish_load(live.applied_offset(), FOLD_VERSION)
        assert restored.digest() == live.digest()
    for index in indexes:
        fold_into(index, records[cut:], [10])
    reference = folded(tmp_path / "one-batch", records, [], indexes)
    assert {index.digest() for index in indexes} == {reference.digest()}
    assert offsets(reference, REFUSED) == newest(records, REFUSED)


def test_a_reopened_index_counts_what_it_holds(
    tmp_path: Path, indexes: list[PartitionIndex]
) -> None:
    records = log_of([GARBAGE] * (POISON_KEPT + EXTRA))
    first = PartitionIndex(tmp_path / "p", 0)
    fold_into(first, records[: POISON_KEPT + 2], [])
    first.close()
    reopened = PartitionIndex(tmp_path / "p", 0)
    indexes.append(reopened)
    fold_into(reopened, records[POISON_KEPT + 2 :], [3])
    assert offsets(reopened, UNDECODABLE) == newest(records, UNDECODABLE)


def test_a_cursor_after_a_trimmed_offset_goes_on_from_the_oldest_kept(
    tmp_path: Path, indexes: list[PartitionIndex]
) -> None:
    records = log_of([GARBAGE] * (POISON_KEPT + EXTRA))
    index = folded(tmp_path / "p", records, [], indexes)
    kept = newest(records, UNDECODABLE)
    assert [e.offset for e, _ in index.undecodable_records(3)] == kept  # 3 was trimmed
    assert [e.offset for e, _ in index.undecodable_records(kept[5])] == kept[6:]


def test_the_readers_help_states_the_bound() -> None:
    """The CLI's help and the API's description say how many are kept and where the rest are."""
    for reader in (operator_undecodable.undecodable, undecodable.list_undecodable):
        text = " ".join((reader.__doc__ or "").split())
        assert f"newest {POISON_KEPT:,} of each partition" in text
        assert "export --partition P --from OFFSET" in text and "archive" in text


def test_a_kept_record_costs_its_bytes_and_about_a_hundred_more(
    tmp_path: Path, indexes: list[PartitionIndex]
) -> None:
    """What docs/operations.md states per kept record (key and value, less the raw bytes)."""
    huge = avro.encode_event(
        JobEnqueued(
            event_id="forged-1", job_id="j" * 70_000, emitted_at=0, source="forger", task="t",
            queue="default", args=b"{}",
        )
    )  # fmt: skip
    values = [GARBAGE, b"", b"y" * 1_000, huge, refused_event(0)]
    index = folded(tmp_path / "p", log_of(values), [], indexes)
    overheads = [
        len(key) + len(value) - len(values[int(U64.unpack(key)[0])])
        for family in (UNDECODABLE, REFUSED)
        for key, value in index.scan(family)
    ]
    assert len(overheads) == len(values) and 64 <= min(overheads) <= max(overheads) <= 112
