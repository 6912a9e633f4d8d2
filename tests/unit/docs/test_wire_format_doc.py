"""docs/wire-format.md against the code: every worked example on the page must be what evsched does.

Each example follows an HTML comment ``<!-- check: NAME -->``; the table or code block after it is
parsed here and recomputed with evsched's own codec, ids and payload functions.
"""

from __future__ import annotations

import json
import re
import struct
import uuid
from pathlib import Path
from typing import Any

from aiokafka.partitioner import murmur2
from fastavro.schema import fingerprint

from evsched.adapters.avro import decode_event, encode_event
from evsched.adapters.avro.registry import schema_fingerprint
from evsched.adapters.contract import load_schema_files
from evsched.adapters.payload import encode_args
from evsched.core import ids
from evsched.core.events import JobEnqueued, RetryPolicy, TraceContext

REPO = Path(__file__).resolve().parents[3]
DOC = (REPO / "docs" / "wire-format.md").read_text(encoding="utf-8")
MARKER = re.compile(r"<!-- check: ([a-z0-9-]+) -->")


def section(name: str) -> list[str]:
    """The lines of the table or fenced block that follows ``<!-- check: name -->``."""
    found = [m for m in MARKER.finditer(DOC) if m.group(1) == name]
    assert len(found) == 1, f"the doc has {len(found)} '{name}' checks"
    lines = DOC[found[0].end() :].lstrip("\n").splitlines()
    if lines[0].strip().startswith("```"):
        end = next(i for i, line in enumerate(lines[1:], 1) if line.strip().startswith("```"))
        return lines[1:end]
    table = []
    for line in lines:
        if not line.strip().startswith("|"):
            break
        table.append(line)
    return table


def rows(name: str) -> list[list[str]]:
    """A table's body rows as cells, without backticks; header and rule skipped."""
    table = section(name)
    assert len(table) > 2, f"no rows in '{name}'"
    return [
        [cell.strip().replace("`", "") for cell in line.strip().strip("|").split("|")]
        for line in table[2:]
    ]


def test_every_check_in_the_doc_is_tested_here() -> None:
    tested = {
        "murmur2",
        "crc64",
        "fingerprints",
        "args",
        "uuid5",
        "body-digest",
        "example-fields",
        "example-bytes",
    }
    assert set(MARKER.findall(DOC)) == tested


def test_the_partition_table_is_kafkas_murmur2() -> None:
    for key, hashed, *partitions in rows("murmur2"):
        value = murmur2(key.encode())
        assert value & 0xFFFFFFFF == int(hashed, 16), key
        assert [(value & 0x7FFFFFFF) % n for n in (3, 6, 12)] == [int(p) for p in partitions], key


def test_the_crc64_test_vectors() -> None:
    for canonical, number, wire in rows("crc64"):
        assert fingerprint(canonical, "CRC-64-AVRO") == wire
        assert struct.unpack("<Q", bytes.fromhex(wire))[0] == int(number, 16)


def test_the_fingerprint_table_lists_every_schema_with_its_fingerprint() -> None:
    listed = {}
    for name, path, wire, signed, _who in rows("fingerprints"):
        schema = json.loads((REPO / path).read_text(encoding="utf-8"))
        assert schema["name"] == name.split()[0], path
        assert schema_fingerprint(schema).hex() == wire, path
        assert struct.unpack("<q", bytes.fromhex(wire))[0] == int(signed), path
        listed[path] = wire
    shipped = {
        f"schemas/{sub + '/' if sub else ''}{file.split('/')[-1]}"
        for sub in ("", "history", "dispatch", "dispatch/history")
        for file in load_schema_files("schemas", sub)
    }
    assert set(listed) == shipped


def test_the_canonical_args_examples() -> None:
    for args, kwargs, expected in rows("args"):
        assert encode_args(json.loads(args), json.loads(kwargs)) == expected.encode()


def test_the_uuid5_rule_and_examples() -> None:
    assert str(ids.EVSCHED_NAMESPACE) in DOC
    assert "`job`, a NUL byte (`0x00`), the queue, a NUL byte, the key" in DOC
    for queue, key, job_id in rows("uuid5"):
        assert ids.job_id_for_key(queue, key) == job_id
        assert uuid.UUID(job_id).version == 5


def test_the_body_digest_example() -> None:
    ((task, queue, args, digest),) = rows("body-digest")
    assert ids.body_digest(task, queue, args.encode()).hex() == digest


def example_event() -> JobEnqueued:
    fields: dict[str, Any] = json.loads("\n".join(section("example-fields")))
    fields["args"] = fields["args"].encode()
    fields["body_digest"] = bytes.fromhex(fields["body_digest"])
    fields["retry"] = RetryPolicy(**fields["retry"])
    fields["trace"] = TraceContext(**fields["trace"])
    fields["after"] = tuple(fields["after"])  # an Avro array reads as a tuple
    return JobEnqueued(**fields)


def example_bytes() -> tuple[list[str], bytes]:
    labels: list[str] = []
    data = bytearray()
    for line in section("example-bytes"):
        tokens = line.split()
        if not re.fullmatch(r"[0-9a-f]{2}", tokens[0]):
            labels.append(tokens.pop(0))
        data += bytes.fromhex("".join(tokens))
    return labels, bytes(data)


def test_the_worked_example_is_what_evsched_writes_and_reads() -> None:
    event = example_event()
    labels, data = example_bytes()
    schema = load_schema_files("schemas")["JobEnqueued.avsc"]
    assert labels == ["header"] + [field["name"] for field in schema["fields"]]
    assert encode_event(event) == data
    assert decode_event(data) == event
    assert f"`{event.job_id}` to `evsched.events`, its value is these {len(data)} bytes" in DOC
    # The example's ids and digest follow the page's own rules.
    assert event.job_id == ids.job_id_for_key(event.queue, event.idempotency_key or "")
    assert event.body_digest == ids.body_digest(event.task, event.queue, event.args)
    assert event.args == encode_args(["2026-03"], {"force": True})
