"""Unit fixtures: a NodeDriver over a fresh data dir, with the planner budgets its module picks;
the indexes a test opens, closed after it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from evsched.adapters.index.store import PartitionIndex
from evsched.core.planner import PlannerBudgets
from evsched.testing import NodeDriver


@pytest.fixture
def driver_budgets() -> PlannerBudgets:
    """The ``driver``'s planner budgets; a module overrides this fixture to pick its own."""
    return PlannerBudgets(dispatch_timeout_ms=30_000)


@pytest.fixture
def driver(tmp_path: Path, driver_budgets: PlannerBudgets) -> Iterator[NodeDriver]:
    """A node on one partition under ``tmp_path / "node"``, closed after the test."""
    node = NodeDriver(tmp_path / "node", budgets=driver_budgets)
    yield node
    node.close()


@pytest.fixture
def indexes() -> Iterator[list[PartitionIndex]]:
    """The indexes a test opens (it appends them), closed after it."""
    opened: list[PartitionIndex] = []
    yield opened
    for index in opened:
        index.close()
