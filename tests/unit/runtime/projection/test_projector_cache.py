"""The projector's cache of committed job states: bounded, never ahead of the index, and a fold
through it gives exactly the index a fold without it gives."""

from __future__ import annotations

from pathlib import Path

from evsched.adapters.index.store import PartitionIndex
from evsched.core.state import Status
from evsched.runtime.projection.projector import Projector
from tests.unit.adapters.index.test_index import Log, enqueued, leased, started, succeeded


def _history(jobs: int) -> Log:
    log = Log()
    for i in range(jobs):
        log.add(enqueued(f"j{i}"), 1_000 + i)
    for i in range(jobs):
        log.add(leased(f"j{i}", 1), 2_000 + i)
        log.add(started(f"j{i}", 1), 2_001 + i)
    for i in range(0, jobs, 2):
        log.add(succeeded(f"j{i}", 1), 3_000 + i)
    return log


def _fold_in_steps(projector: Projector, log: Log, step: int) -> None:
    for start in range(0, len(log.records), step):
        projector.commit(projector.fold(log.records[start : start + step]))


def test_a_fold_through_a_small_cache_builds_the_same_index(tmp_path: Path) -> None:
    log = _history(40)
    cached = PartitionIndex(tmp_path / "cached", 0)
    uncached = PartitionIndex(tmp_path / "uncached", 0)
    small = Projector(cached, cache_size=8)
    _fold_in_steps(small, log, 3)
    _fold_in_steps(Projector(uncached, cache_size=0), log, 3)
    assert len(small._cache) <= 8
    assert cached.digest() == uncached.digest()
    for idx in (cached, uncached):
        idx.close()


def test_the_cache_holds_only_committed_states(tmp_path: Path) -> None:
    index = PartitionIndex(tmp_path / "p0", 0)
    log = Log()
    log.add(enqueued("a"), 1_000)
    projector = Projector(index)
    projector.commit(projector.fold(log.records))
    log.add(leased("a", 1), 1_001)
    projector.fold(log.records[1:])  # folded but never committed (its transaction failed)
    state = projector.job("a")
    assert state is not None and state.status is Status.SCHEDULED
    assert state == index.job("a")
    index.close()
