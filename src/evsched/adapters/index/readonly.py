"""A partition index opened read-only: reads even while another process (a node) holds its lock.

A read-write open would take RocksDB's lock, which a running node holds, and could create
files in the node's directory; a read-only open sees a consistent view of what was written.
An index written by an older version may lack a family (a read-only open cannot create it):
it reads as empty, so such an index is still read, and found to be of another fold version.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from rocksdict import AccessType, Options, Rdict

from evsched.adapters.index.store import COLUMN_FAMILIES, PartitionIndex
from evsched.errors import StoreError


class ReadOnlyIndex(PartitionIndex):
    """``PartitionIndex``'s reads (``applied_offset``, ``digest``...) over a read-only open.

    It fills the same attributes as ``PartitionIndex.__init__`` does; writes fail in RocksDB.
    """

    def __init__(self, path: Path, partition: int) -> None:
        if not (path / "CURRENT").is_file():
            raise StoreError(f"no RocksDB index at {path}")
        self.path = path
        self.partition = partition
        try:
            present = set(Rdict.list_cf(str(path), Options(raw_mode=True)))
            names = [name for name in COLUMN_FAMILIES if name in present]
            families = {name: Options(raw_mode=True) for name in names}
            self._db = Rdict(
                str(path),
                Options(raw_mode=True),
                column_families=families,
                access_type=AccessType.read_only(),
            )
        except Exception as exc:
            raise StoreError(f"cannot open index at {path} read-only: {exc}") from exc
        self._cf = {name: self._db.get_column_family(name) for name in names}
        self._handles = {name: self._db.get_column_family_handle(name) for name in names}

    def _scan(
        self, name: str, start: bytes = b"", end: bytes | None = None
    ) -> Iterator[tuple[bytes, bytes]]:
        if name in self._cf:
            yield from super()._scan(name, start, end)
