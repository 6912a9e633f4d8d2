"""Known writer schemas of events by CRC-64-AVRO fingerprint: current ones and their history."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeAlias

from fastavro import parse_schema
from fastavro.schema import fingerprint, to_parsing_canonical_form

from evsched.adapters.contract import load_schema_files
from evsched.errors import ContractError

ParsedSchema: TypeAlias = dict[str, Any]

# Avro single-object encoding: this marker, then the 8-byte fingerprint, then the binary body.
MAGIC = b"\xc3\x01"
HEADER_SIZE = len(MAGIC) + 8
EVENT_NAMESPACE = "evsched.events"


def parse_contract_schema(schema: Any, origin: str) -> ParsedSchema:
    """Parse once, alone: a file that leans on a named type defined elsewhere fails here."""
    try:
        parsed = parse_schema(schema)
    except Exception as exc:  # fastavro raises several unrelated types for a bad schema
        raise ContractError(f"{origin}: {type(exc).__name__}: {exc}") from exc
    if not isinstance(parsed, dict):
        raise ContractError(f"{origin}: not a record schema")
    return parsed


def schema_fingerprint(schema: Any) -> bytes:
    """CRC-64-AVRO of the parsing canonical form, little-endian, as single-object encoding wants it.

    Deliberately not parsed with ``expand=True``: every contract file is self-contained, and
    expanding would inline a named type at its second use, where the spec's canonical form (and so
    every other Avro library's fingerprint) refers to it by name.
    """
    return bytes.fromhex(fingerprint(to_parsing_canonical_form(schema), "CRC-64-AVRO"))


@dataclass(frozen=True, slots=True)
class WriterSchema:
    """One schema events may have been written with; ``kind`` is the record's short name."""

    kind: str
    fingerprint: bytes
    schema: ParsedSchema
    origin: str
    current: bool


def _writer_schema(schema: Any, origin: str, *, current: bool) -> WriterSchema:
    if not isinstance(schema, dict) or schema.get("namespace") != EVENT_NAMESPACE:
        raise ContractError(f"{origin}: not a record of namespace {EVENT_NAMESPACE}")
    name = schema.get("name")
    if not isinstance(name, str):
        raise ContractError(f"{origin}: not a record of namespace {EVENT_NAMESPACE}")
    return WriterSchema(
        kind=name,
        fingerprint=schema_fingerprint(schema),
        schema=parse_contract_schema(schema, origin),
        origin=origin,
        current=current,
    )


class SchemaRegistry:
    """Writer schemas by fingerprint, each tied to its event kind and that kind's current schema."""

    def __init__(self, writers: Iterable[WriterSchema]) -> None:
        self._by_fingerprint: dict[bytes, WriterSchema] = {}
        self._current: dict[str, WriterSchema] = {}
        for writer in writers:
            clash = self._by_fingerprint.get(writer.fingerprint)
            if clash is not None:
                raise ContractError(f"{writer.origin} has the fingerprint of {clash.origin}")
            self._by_fingerprint[writer.fingerprint] = writer
            if writer.current:
                if writer.kind in self._current:
                    raise ContractError(f"two current schemas for {writer.kind}")
                self._current[writer.kind] = writer
        orphans = {w.kind for w in self._by_fingerprint.values()} - self._current.keys()
        if orphans:
            raise ContractError(f"history schemas without a current schema: {sorted(orphans)}")

    @classmethod
    def from_files(
        cls, current: Mapping[str, Any], history: Mapping[str, Any] | None = None
    ) -> SchemaRegistry:
        """Build from schema JSON keyed by file path; a current file is named after its kind."""
        writers = [_writer_schema(s, path, current=True) for path, s in current.items()]
        for writer in writers:
            if writer.origin.removesuffix(".avsc") != writer.kind:
                raise ContractError(f"{writer.origin} holds {writer.kind}: name it after its kind")
        history = history or {}
        writers += [_writer_schema(s, path, current=False) for path, s in history.items()]
        return cls(writers)

    @classmethod
    def from_contract(cls) -> SchemaRegistry:
        """The schemas shipped with evsched: ``schemas/`` and ``schemas/history/``."""
        return cls.from_files(load_schema_files("schemas"), load_schema_files("schemas", "history"))

    @property
    def kinds(self) -> frozenset[str]:
        return frozenset(self._current)

    def current(self, kind: str) -> WriterSchema:
        """The schema new events of ``kind`` are written with."""
        try:
            return self._current[kind]
        except KeyError:
            raise ContractError(f"no schema for event kind {kind!r}") from None

    def lookup(self, fingerprint: bytes) -> WriterSchema | None:
        return self._by_fingerprint.get(fingerprint)

    def writers(self) -> tuple[WriterSchema, ...]:
        return tuple(self._by_fingerprint.values())
