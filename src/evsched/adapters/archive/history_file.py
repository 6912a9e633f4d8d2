"""History files: records of the events log in an Avro container file, byte for byte reproducible.

The record is ``evsched.history.LoggedEvent`` (``projections/export/LoggedEvent.avsc``). Files are
written with a fixed sync marker, a deterministic codec and sorted records, and carry no clock
reading, so exporting the same records twice gives identical files.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import fastavro
from fastavro.schema import to_parsing_canonical_form
from fastavro.write import Writer

from evsched.adapters import avro
from evsched.adapters.contract import load_schema_files
from evsched.adapters.proofs import proof_of
from evsched.errors import ContractError, DecodeError, EvschedError
from evsched.ports import Record

SCHEMA_PATH = "export/LoggedEvent.avsc"
UNDECODABLE = "undecodable"
CODECS = ("deflate", "null")
_COMPRESSION_LEVEL = 6
# Metadata keys of our own; fastavro adds avro.schema and avro.codec.
META_PREFIX = "evsched."


class HistoryFileError(EvschedError):
    """A history file that cannot be read (missing, not Avro, or not LoggedEvent records)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LoggedEvent:
    """One record of the events log: position, broker time, key and value as written."""

    partition: int
    offset: int
    log_at: int
    key: bytes | None
    value: bytes
    kind: str
    # The record's proof header (adapters.proofs), None when it had none.
    proof: bytes | None = None

    @classmethod
    def from_record(cls, record: Record) -> LoggedEvent:
        value = record.value or b""
        return cls(
            partition=record.partition,
            offset=record.offset,
            log_at=record.log_at,
            key=record.key,
            value=value,
            kind=kind_of(value),
            proof=proof_of(record.headers) if record.headers else None,
        )

    @property
    def position(self) -> tuple[int, int]:
        return (self.partition, self.offset)


def kind_of(value: bytes) -> str:
    """The event kind ``value`` decodes to, or ``undecodable``."""
    try:
        return type(avro.decode_event(value)).__name__
    except DecodeError:
        return UNDECODABLE


def _load_schema() -> Any:
    raw = load_schema_files("projections", "export").get(SCHEMA_PATH)
    if not isinstance(raw, dict) or raw.get("name") != "LoggedEvent":
        raise ContractError(f"projections/{SCHEMA_PATH}: no LoggedEvent record")
    return raw


# Files are written with the schema as loaded: fastavro puts the schema it is given in the header,
# and a parsed schema's key order varies between processes (it copies field properties from a
# set), which would make two exports of the same records differ.
_RAW_SCHEMA = _load_schema()
_SCHEMA = fastavro.parse_schema(_RAW_SCHEMA)
# Fixed per schema, so a file's bytes depend only on its records and metadata.
SYNC_MARKER = hashlib.blake2b(
    to_parsing_canonical_form(_SCHEMA).encode(), digest_size=16, person=b"evsched-history"
).digest()


class HistoryWriter:
    """Writes LoggedEvent records, in the order given, to a container file on ``out``.

    ``metadata`` keys get the ``evsched.`` prefix and are written sorted; it never holds a clock
    reading. Call ``close`` to write the last block (the stream itself stays open).
    """

    def __init__(
        self, out: BinaryIO, *, metadata: Mapping[str, str], codec: str = "deflate"
    ) -> None:
        if codec not in CODECS:
            raise ValueError(f"codec must be one of {CODECS}, not {codec!r}")
        meta = {f"{META_PREFIX}{k}": str(v) for k, v in sorted(metadata.items())}
        self._writer = Writer(
            out,
            _RAW_SCHEMA,
            codec=codec,
            metadata=meta,
            sync_marker=SYNC_MARKER,
            compression_level=_COMPRESSION_LEVEL if codec == "deflate" else None,
        )
        self.count = 0

    def write(self, event: LoggedEvent) -> None:
        self._writer.write(
            {
                "partition": event.partition,
                "offset": event.offset,
                "log_at": event.log_at,
                "key": event.key,
                "value": event.value,
                "kind": event.kind,
                "proof": event.proof,
            }
        )
        self.count += 1

    def close(self) -> None:
        self._writer.flush()


def write_history(
    out: BinaryIO,
    events: Iterable[LoggedEvent],
    *,
    metadata: Mapping[str, str],
    codec: str = "deflate",
) -> int:
    """Write ``events`` (already in (partition, offset) order) to ``out``; how many were written."""
    writer = HistoryWriter(out, metadata=metadata, codec=codec)
    for event in events:
        writer.write(event)
    writer.close()
    return writer.count


@dataclass(frozen=True, slots=True)
class HistoryFile:
    """A history file read back: its records in file order and its ``evsched.*`` metadata."""

    events: list[LoggedEvent]
    metadata: dict[str, str]


def read_history(path: Path) -> HistoryFile:
    """Every record of the history file at ``path``; HistoryFileError when it can't be read."""
    metadata: dict[str, str] = {}
    events = list(iter_history(path, metadata))
    return HistoryFile(events, metadata)


def iter_history(path: Path, metadata: dict[str, str] | None = None) -> Iterator[LoggedEvent]:
    """The records of the history file at ``path``, one at a time (its ``evsched.*`` metadata
    goes into ``metadata`` once the header is read); HistoryFileError when it can't be read."""
    try:
        with path.open("rb") as stream:
            reader = fastavro.reader(stream, reader_schema=_SCHEMA)
            if metadata is not None:
                metadata.update(
                    (k.removeprefix(META_PREFIX), _text(v))
                    for k, v in reader.metadata.items()
                    if k.startswith(META_PREFIX)
                )
            for record in reader:
                yield _logged(record)
    except OSError as exc:
        raise HistoryFileError(f"cannot read {path}: {exc.strerror or exc}") from exc
    except Exception as exc:  # fastavro reports a foreign file with assorted exception types
        raise HistoryFileError(f"{path} is not an evsched history file: {exc}") from exc


def _logged(record: Any) -> LoggedEvent:
    return LoggedEvent(
        partition=record["partition"],
        offset=record["offset"],
        log_at=record["log_at"],
        key=record["key"],
        value=record["value"],
        kind=record["kind"],
        proof=record.get("proof"),
    )


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
