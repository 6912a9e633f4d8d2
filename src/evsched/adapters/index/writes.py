"""Index writes as a list of changes: what a fold's batch does to RocksDB, seen by a changelog."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rocksdict import WriteBatch

# One key's change in a mirrored column family: (family, key, value; None for a delete).
Change = tuple[str, bytes, bytes | None]


class Recorder:
    """A WriteBatch that also lists every put and delete of a mirrored family, in order.

    Whatever writes the index through it (a fold's batch, a purge) shows in ``changes``, so
    every delete becomes a changelog tombstone without the writer knowing of the changelog.
    """

    def __init__(self, families: dict[int, str]) -> None:
        self.batch = WriteBatch(raw_mode=True)
        self.changes: list[Change] = []
        self._families = families  # id of a mirrored family's handle -> its name

    def put(self, key: bytes, value: bytes, handle: Any) -> None:
        self.batch.put(key, value, handle)
        if (name := self._families.get(id(handle))) is not None:
            self.changes.append((name, key, value))

    def delete(self, key: bytes, handle: Any) -> None:
        self.batch.delete(key, handle)
        if (name := self._families.get(id(handle))) is not None:
            self.changes.append((name, key, None))


@dataclass(slots=True)
class PreparedWrite:
    """A batch as RocksDB writes, not applied yet, with the changes it makes (for a changelog)."""

    recorder: Recorder
    applied_offset: int
    fold_version: int
    # What the index keeps in memory about its keys, to update once the batch is written (a
    # batch prepared and then dropped, its transaction aborted, must leave no trace).
    on_applied: list[Callable[[], None]] = field(default_factory=list)

    @property
    def changes(self) -> list[Change]:
        return self.recorder.changes
