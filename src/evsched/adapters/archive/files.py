"""Archive directories: per-partition history files named by their offsets, whole or absent.

Layout under the archive's root::

    evsched-archive.json                      namespace and partition count (written once)
    p0003/00000000000000000000-00000000000000049999.avro        a sealed file: never changes
    p0003/00000000000000050000-00000000000000050211.tail.avro   the newest records, not yet a
                                                                 full file: replaced as it grows
    p0003/.00000000000000050000.partial       a file being written (deleted on the next start)
    .lock                                     held by the archiver writing here

A name gives the offsets of the first and last record in the file; the offsets between two files
that no file holds were transaction markers or aborted records, which a read_committed reader
never sees. Each file is ``evsched export``'s format (``history_file``), written to a temp file,
fsynced and renamed into place, so a crash leaves whole files and, at worst, a temp file.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from evsched.adapters.archive.history_file import HistoryWriter, LoggedEvent, iter_history
from evsched.errors import EvschedError

MANIFEST = "evsched-archive.json"
FORMAT = "evsched.archive/1"
PARTIAL_SUFFIX = ".partial"
LOCK = ".lock"
_NAME = re.compile(r"(\d{20})-(\d{20})(\.tail)?\.avro")
_PARTITION_DIR = re.compile(r"p(\d{4,})")


class ArchiveError(EvschedError):
    """An archive directory that cannot be used as asked: another namespace, a gap, a bad file."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ArchiveFile:
    """One finished file of a partition: the offsets of its first and last record."""

    partition: int
    first: int
    last: int
    tail: bool
    path: Path


def partition_dir(root: Path, partition: int) -> Path:
    return root / f"p{partition:04d}"


def file_name(first: int, last: int, *, tail: bool) -> str:
    return f"{first:020d}-{last:020d}{'.tail' if tail else ''}.avro"


def listed(root: Path, partition: int) -> list[ArchiveFile]:
    """Every finished file of ``partition``, by first offset, longest first."""
    folder = partition_dir(root, partition)
    found = []
    for path in folder.iterdir() if folder.is_dir() else ():
        if m := _NAME.fullmatch(path.name):
            first, last = int(m[1]), int(m[2])
            found.append(
                ArchiveFile(partition=partition, first=first, last=last, tail=bool(m[3]), path=path)
            )
    return sorted(found, key=lambda f: (f.first, -f.last, f.tail))


def covering(files: list[ArchiveFile]) -> list[ArchiveFile]:
    """The files a reader reads, in order: a file within one read before it is left out.

    That is a tail a later tail or the sealed file replaced, whose deletion a crash prevented.
    """
    kept: list[ArchiveFile] = []
    for file in files:
        if kept and file.last <= kept[-1].last:
            continue
        if kept and file.first <= kept[-1].last:
            raise ArchiveError(
                f"{file.path} overlaps {kept[-1].path}: not a file this archiver wrote"
            )
        kept.append(file)
    return kept


def tidy(root: Path, partition: int) -> list[Path]:
    """Delete a crash's leftovers in ``partition``'s folder: temp files, replaced tails."""
    folder = partition_dir(root, partition)
    files = listed(root, partition)
    kept = {f.path for f in covering(files)}
    gone = [f.path for f in files if f.path not in kept]
    gone += [p for p in folder.glob(f".*{PARTIAL_SUFFIX}")] if folder.is_dir() else []
    for path in gone:
        path.unlink(missing_ok=True)
    if gone:
        _fsync_dir(folder)
    return gone


def seal(tail: ArchiveFile) -> ArchiveFile:
    """Keep a tail as a sealed file (its range can no longer be read again from the log)."""
    path = tail.path.with_name(file_name(tail.first, tail.last, tail=False))
    tail.path.replace(path)
    _fsync_dir(path.parent)
    return ArchiveFile(
        partition=tail.partition, first=tail.first, last=tail.last, tail=False, path=path
    )


def read_file(file: ArchiveFile) -> Iterator[LoggedEvent]:
    """The records of ``file``; ArchiveError for a record that its name does not cover."""
    for event in iter_history(file.path):
        if event.partition != file.partition or not file.first <= event.offset <= file.last:
            raise ArchiveError(
                f"{file.path} holds p{event.partition}@{event.offset}, outside its name's range"
            )
        yield event


def partition_events(root: Path, partition: int, start: int = 0) -> Iterator[LoggedEvent]:
    """The archived records of ``partition`` from offset ``start`` on, in offset order."""
    for file in covering(listed(root, partition)):
        if file.last < start:
            continue
        for event in read_file(file):
            if event.offset >= start:
                yield event


def archived_partitions(root: Path) -> int:
    """How many partitions the archive at ``root`` has (its manifest, else its folders)."""
    manifest = read_manifest(root)
    if manifest is not None:
        return int(str(manifest["partitions"]))
    found = [int(m[1]) for p in root.iterdir() if (m := _PARTITION_DIR.fullmatch(p.name))]
    if not found:
        raise ArchiveError(f"{root} is not an evsched archive (no {MANIFEST}, no p0000 folders)")
    return max(found) + 1


def read_manifest(root: Path) -> dict[str, object] | None:
    path = root / MANIFEST
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except ValueError as exc:
        raise ArchiveError(f"{path} is not JSON: {exc}") from None
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise ArchiveError(f"{path} is not an evsched archive manifest ({FORMAT})")
    return document


def write_manifest(root: Path, namespace: str, partitions: int) -> None:
    """Write the manifest atomically (temp file, fsync, rename)."""
    root.mkdir(parents=True, exist_ok=True)
    document = {"format": FORMAT, "namespace": namespace, "partitions": partitions}
    temp = root / f".{MANIFEST}{PARTIAL_SUFFIX}"
    with temp.open("w", encoding="utf-8") as stream:
        json.dump(document, stream, sort_keys=True, indent=2)
        stream.write("\n")
        stream.flush()
        os.fsync(stream.fileno())
    temp.replace(root / MANIFEST)
    _fsync_dir(root)


class ArchiveLock:
    """The one archiver of a directory: an exclusive lock on ``.lock`` until ``release``."""

    def __init__(self, root: Path) -> None:
        root.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(root / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(self._fd)
            raise ArchiveError(f"another evsched archive is writing to {root}") from None

    def release(self) -> None:
        os.close(self._fd)  # closing drops the lock


class FileWriter:
    """Writes one file of a partition from offset ``first`` on; ``finish`` makes it visible.

    ``payload_bytes`` counts keys and values written, for the roll rule: it depends only on the
    records, so a fresh archive of the same records rolls at the same offsets.
    """

    def __init__(self, root: Path, namespace: str, partition: int, first: int) -> None:
        self.folder = partition_dir(root, partition)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.partition = partition
        self.first = first
        self.last = first
        self.payload_bytes = 0
        self.temp = self.folder / f".{first:020d}{PARTIAL_SUFFIX}"
        self._stream = self.temp.open("wb")
        metadata = {
            "namespace": namespace,
            "selection": "archive",
            "partition": str(partition),
            "from": str(first),
        }
        self._writer = HistoryWriter(self._stream, metadata=metadata)

    @property
    def count(self) -> int:
        return self._writer.count

    def write(self, event: LoggedEvent) -> None:
        self._writer.write(event)
        self.last = event.offset
        self.payload_bytes += len(event.key or b"") + len(event.value)

    def finish(self, *, tail: bool) -> ArchiveFile:
        """Flush, fsync and rename the file into place; delete the tails it replaces."""
        self._writer.close()
        self._stream.flush()
        os.fsync(self._stream.fileno())
        self._stream.close()
        path = self.folder / file_name(self.first, self.last, tail=tail)
        self.temp.replace(path)
        _fsync_dir(self.folder)
        for old in listed(self.folder.parent, self.partition):
            if old.tail and old.first == self.first and old.path != path:
                old.path.unlink(missing_ok=True)
        return ArchiveFile(
            partition=self.partition, first=self.first, last=self.last, tail=tail, path=path
        )

    def abandon(self) -> None:
        """Drop the file being written."""
        self._stream.close()
        self.temp.unlink(missing_ok=True)


def _fsync_dir(folder: Path) -> None:
    """Make a rename or unlink in ``folder`` durable."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
