"""Where a rebuild writes: a directory evsched marked as its own, the only kind --replace deletes.

``evsched rebuild`` writes a marker file at the top of every ``--data-dir`` it fills. Replacing
deletes such a directory only when it holds nothing but the marker and partition indexes
(``p0000``...), none of them open in another process (RocksDB's ``LOCK`` held: a live node or
API). Anything else is refused by name: a node's index, a home directory, a typo.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
from pathlib import Path

MARKER = ".evsched-rebuild"
MARKER_TEXT = "made by `evsched rebuild`; `evsched rebuild --replace` may delete this directory\n"
_PARTITION_DIR = re.compile(r"p\d{4,}")


class NotOurs(Exception):
    """``--replace`` must not delete this directory; the message names what is in the way."""


def mark(data_dir: Path) -> None:
    """Create ``data_dir`` (if needed) and mark it as a rebuild's."""
    data_dir.mkdir(parents=True, exist_ok=True)
    (data_dir / MARKER).write_text(MARKER_TEXT, encoding="utf-8")


def check_replaceable(data_dir: Path) -> None:
    """Raise NotOurs unless deleting ``data_dir`` deletes only a rebuild evsched made."""
    if not data_dir.exists():
        return
    if data_dir.is_symlink() or not data_dir.is_dir():
        raise NotOurs(f"{data_dir} is not a directory a rebuild made")
    entries = sorted(data_dir.iterdir())
    if not entries:
        return
    if not (data_dir / MARKER).is_file():
        raise NotOurs(
            f"{data_dir} was not made by `evsched rebuild` (no {MARKER} file): "
            "delete it yourself if it is yours to delete"
        )
    for entry in entries:
        _check_entry(entry)


def _check_entry(entry: Path) -> None:
    if entry.name == MARKER:
        return
    if entry.is_symlink() or not entry.is_dir() or not _PARTITION_DIR.fullmatch(entry.name):
        raise NotOurs(f"{entry} is not a partition index a rebuild made")
    if lock_held(entry):
        raise NotOurs(f"{entry} is open in another process (its RocksDB LOCK is held)")


def lock_held(index_dir: Path) -> bool:
    """Whether another process holds the RocksDB lock of the index in ``index_dir``.

    Probed with the same POSIX record lock RocksDB takes. Never call it on an index this
    process has open: closing the probe would drop this process's own lock on the file.
    """
    lock = index_dir / "LOCK"
    if not lock.is_file():
        return False
    fd = os.open(lock, os.O_RDWR)
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return True
    else:
        fcntl.lockf(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)


def replace(data_dir: Path) -> None:
    """Delete a rebuild's directory after ``check_replaceable`` passes (checked again here)."""
    check_replaceable(data_dir)
    if data_dir.exists():
        shutil.rmtree(data_dir)
