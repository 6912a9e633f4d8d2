"""A node's live index read while the node runs: its applied offset and digest, for --verify."""

from __future__ import annotations

from pathlib import Path

from evsched.adapters.index.readonly import ReadOnlyIndex
from evsched.core.tallies import PROOFS_REQUIRED


def live_state(live_dir: Path, partition: int) -> tuple[int, str, int | None] | None:
    """(applied offset, digest, fold version) of the live index of ``partition``, or None when
    there is none."""
    path = live_dir / f"p{partition:04d}"
    if not path.is_dir():
        return None
    index = ReadOnlyIndex(path, partition)
    try:
        return index.applied_offset(), index.digest(), index.fold_version()
    finally:
        index.close()


def requires_proofs(live_dir: Path, partition: int) -> bool:
    """Whether the live index of ``partition`` requires proofs of role (core.roles): folding its
    log without the node keys cannot reach the same index."""
    path = live_dir / f"p{partition:04d}"
    if not path.is_dir():
        return False
    index = ReadOnlyIndex(path, partition)
    try:
        return index.tallies().get(PROOFS_REQUIRED, 0) > 0
    finally:
        index.close()
