"""``api.as_of.RebuiltIndexes``' cache and queue, with the child ``evsched rebuild`` replaced by a
stand-in that makes an empty index per partition (the real one runs in
``tests/integration/test_as_of.py``): bounded in entries and bytes, least recently read evicted
and deleted, one build per cut however many ask, a 202 (None) while it runs, too many refused,
and a failed rebuild's reason passed on."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from evsched.adapters.index.store import PartitionIndex
from evsched.api.as_of import BuildBusy, BuildFailed, RebuiltIndexes, Until, _outcome
from evsched.settings import Settings


class Stubbed(RebuiltIndexes):
    def __init__(self, root: Path, **options: int) -> None:
        super().__init__(Settings(namespace="cache"), root=root, **options)
        self.rebuilt: list[Until] = []
        self.gate = asyncio.Event()
        self.gate.set()

    async def _rebuild(self, until: Until, directory: Path) -> dict[str, object]:
        await self.gate.wait()
        self.rebuilt.append(until)
        for partition, _ in until:
            PartitionIndex(directory / f"p{partition:04d}", partition).close()
        return {"events": 0}


def cut(offset: int) -> Until:
    return ((0, offset), (1, offset))


async def test_entries_are_kept_up_to_the_bound_least_recently_read_evicted(
    tmp_path: Path,
) -> None:
    past = Stubbed(tmp_path, max_entries=2)
    first = await past.indexes(cut(1), 5.0)
    assert first is not None and sorted(first.indexes) == [0, 1]
    assert first.indexes[0].applied_offset() == -1 and first.size_bytes > 0
    second = await past.indexes(cut(2), 5.0)
    assert second is not None
    assert await past.indexes(cut(1), 5.0) is first  # read again: now the most recent
    await past.indexes(cut(3), 5.0)
    assert past.rebuilt == [cut(1), cut(2), cut(3)]
    assert second.directory is not None and not second.directory.exists()  # evicted, deleted
    assert first.directory is not None and first.directory.exists()
    await past.close()
    assert not await asyncio.to_thread(tmp_path.exists)


async def test_a_byte_bound_keeps_only_the_newest(tmp_path: Path) -> None:
    past = Stubbed(tmp_path, max_bytes=1)
    one = await past.indexes(cut(1), 5.0)
    two = await past.indexes(cut(2), 5.0)
    assert one is not None and one.directory is not None and not one.directory.exists()
    assert two is not None and two.directory is not None and two.directory.exists()
    await past.close()


async def test_one_build_per_cut_a_202_meanwhile_and_a_bounded_queue(tmp_path: Path) -> None:
    past = Stubbed(tmp_path, max_pending=2)
    past.gate.clear()
    assert await past.indexes(cut(1), 0.01) is None
    assert await past.indexes(cut(1), 0.01) is None  # the same build, not a second one
    assert await past.indexes(cut(2), 0.01) is None
    with pytest.raises(BuildBusy, match="2 as-of indexes are being built"):
        await past.indexes(cut(3), 0.01)
    past.gate.set()
    built = await past.indexes(cut(1), 5.0)
    assert built is not None and past.rebuilt[0] == cut(1)
    assert await past.indexes(cut(2), 5.0) is not None
    assert sorted(past.rebuilt) == [cut(1), cut(2)]
    await past.close()


async def test_close_cancels_a_build_in_progress(tmp_path: Path) -> None:
    past = Stubbed(tmp_path)
    past.gate.clear()
    assert await past.indexes(cut(1), 0.01) is None
    await past.close()
    assert past.rebuilt == [] and not await asyncio.to_thread(tmp_path.exists)


def test_a_failed_rebuild_names_its_partitions_problems(tmp_path: Path) -> None:
    document = b'{"partitions": [{"partition": 1, "problem": "not rebuilt: trimmed"}]}'
    with pytest.raises(BuildFailed, match="partition 1: not rebuilt: trimmed"):
        _outcome(1, document, b"", tmp_path / "gone")
    with pytest.raises(BuildFailed, match="error: broker down"):
        _outcome(3, b"", b"error: broker down\n", tmp_path / "gone")
    with pytest.raises(BuildFailed, match="exit code -9"):
        _outcome(-9, b"not json", b"", tmp_path / "gone")
    assert _outcome(0, b'{"events": 3}', b"", tmp_path) == {"events": 3}
