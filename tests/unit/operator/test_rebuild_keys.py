"""``evsched rebuild --verify`` of a live index that requires proofs needs the node keys."""

from __future__ import annotations

from pathlib import Path

import pytest

from evsched.adapters.index.store import IndexBatch, PartitionIndex
from evsched.adapters.proofs import KEY_ENV, KEY_FILE_ENV, generate_key
from evsched.core.fold import FOLD_VERSION
from evsched.core.tallies import PROOFS_REQUIRED
from evsched.operator.commands.rebuild import _check_keys
from evsched.operator.exits import ExitCode, OperatorError


def _live(live_dir: Path, partition: int, *, proofs: bool) -> None:
    index = PartitionIndex(live_dir / f"p{partition:04d}", partition)
    try:
        tallies = {PROOFS_REQUIRED: 1} if proofs else {"succeeded": 1}
        index.write(IndexBatch(tallies=tallies), 0, FOLD_VERSION)
    finally:
        index.close()


def test_without_keys_a_live_index_that_requires_proofs_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(KEY_ENV, raising=False)
    monkeypatch.delenv(KEY_FILE_ENV, raising=False)
    _live(tmp_path, 0, proofs=False)
    _live(tmp_path, 1, proofs=True)
    with pytest.raises(OperatorError) as refused:
        _check_keys(tmp_path, [0, 1, 2])
    assert refused.value.code is ExitCode.USAGE
    assert "partition 1 requires proofs of role" in refused.value.message
    assert KEY_ENV in refused.value.message


def test_with_keys_or_without_proofs_the_rebuild_goes_ahead(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(KEY_ENV, raising=False)
    monkeypatch.delenv(KEY_FILE_ENV, raising=False)
    _live(tmp_path, 0, proofs=False)
    _check_keys(tmp_path, [0, 1])
    _live(tmp_path, 1, proofs=True)
    monkeypatch.setenv(KEY_ENV, generate_key())
    _check_keys(tmp_path, [0, 1])
