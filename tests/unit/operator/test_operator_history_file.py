"""History files are Avro container files of LoggedEvent records that read back as written and are
byte for byte the same for the same records, whatever process writes them."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import fastavro
import pytest

from evsched.adapters.archive.history_file import (
    HistoryFileError,
    LoggedEvent,
    kind_of,
    read_history,
    write_history,
)
from tests.unit.operator.test_operator_audit import Story, enq, lease

REPO = Path(__file__).resolve().parents[3]


def events() -> list[LoggedEvent]:
    story = Story()
    story.add(enq("a"))
    story.add(lease("a", 1, 1))
    story.add(b"\xc3\x01garbage")
    return [LoggedEvent.from_record(record) for record in story.records]


def test_records_read_back_with_their_kind_and_metadata(tmp_path: Path) -> None:
    path = tmp_path / "h.avro"
    written = events()
    with path.open("wb") as out:
        count = write_history(out, written, metadata={"selection": "job", "job": "a"})

    read = read_history(path)
    assert count == 3
    assert read.events == written
    assert [e.kind for e in read.events] == ["JobEnqueued", "JobLeased", "undecodable"]
    assert read.metadata == {"job": "a", "selection": "job"}
    with path.open("rb") as stream:  # any Avro library reads it: it is a plain container file
        assert [r["offset"] for r in fastavro.reader(stream)] == [0, 1, 2]


@pytest.mark.parametrize("codec", ["deflate", "null"])
def test_the_same_records_give_the_same_bytes(codec: str) -> None:
    first, second, written = io.BytesIO(), io.BytesIO(), events()
    write_history(first, written, metadata={"a": "1"}, codec=codec)
    write_history(second, list(written), metadata={"a": "1"}, codec=codec)
    assert first.getvalue() == second.getvalue()


WRITE = """
import hashlib, io, sys
sys.path.insert(0, {repo!r})
from evsched.adapters.archive.history_file import write_history
from tests.unit.operator.test_operator_history_file import events
out = io.BytesIO()
write_history(out, events(), metadata={{"namespace": "ns", "selection": "range"}})
print(hashlib.sha256(out.getvalue()).hexdigest())
"""


def test_processes_with_other_hash_seeds_write_the_same_bytes() -> None:
    # fastavro copies schema properties from a set, whose order depends on the hash seed: the
    # header must not depend on it.
    digests = set()
    for seed in ("1", "2", "3"):
        done = subprocess.run(
            [sys.executable, "-c", WRITE.format(repo=str(REPO))],
            env={**os.environ, "PYTHONHASHSEED": seed},
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        )
        digests.add(done.stdout.strip())
    assert len(digests) == 1


def test_a_file_that_is_not_a_history_is_refused(tmp_path: Path) -> None:
    other = tmp_path / "other.avro"
    with other.open("wb") as out:
        fastavro.writer(out, {"type": "record", "name": "X", "fields": []}, [{}])
    (tmp_path / "text.avro").write_text("hello")

    for path in (other, tmp_path / "text.avro", tmp_path / "missing.avro"):
        with pytest.raises(HistoryFileError):
            read_history(path)


def test_undecodable_bytes_have_a_kind_too() -> None:
    assert kind_of(b"") == "undecodable"
    assert kind_of(b"\xc3\x01" + b"\x00" * 9) == "undecodable"
