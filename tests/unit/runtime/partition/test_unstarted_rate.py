"""A node's unstarted limit follows its start rate: ``--max-unstarted`` is the floor, a queue
whose workers start jobs quickly may hold ``--unstarted-horizon-ms`` of its recent starts leased
but unstarted (up to ``--max-in-flight``), and the raise lapses when the starts stop."""

from __future__ import annotations

from pathlib import Path

from evsched.core.planner import PlannerBudgets
from evsched.runtime.partition.budget import RATE_WINDOW_S, QueueBudget, StartRate
from evsched.testing import NodeDriver
from tests.unit.node_driver_events import enqueued, started


def test_the_limit_is_the_horizon_of_recent_starts_between_floor_and_cap() -> None:
    rate = StartRate()
    assert rate.limits(10, 1_000, 1.0, at=0.0) == {}  # no starts: every queue keeps its floor
    rate.add({"fast": 400, "slow": 2, "none": 0}, at=0.0)
    rate.add({"fast": 400}, at=1.0)
    # 800 starts in the 2 s window: 400/s, so 1 s of them; "slow" stays at its floor.
    assert rate.limits(10, 1_000, 1.0, at=1.5) == {"fast": 400, "slow": 10}
    assert rate.limits(10, 300, 1.0, at=1.5)["fast"] == 300  # never above the cap
    assert rate.limits(10, 1_000, 0.0, at=1.5)["fast"] == 10  # horizon 0: the floor holds
    # The first second's starts leave the window, then the second's.
    assert rate.limits(10, 1_000, 1.0, at=RATE_WINDOW_S + 0.5)["fast"] == 200
    assert rate.limits(10, 1_000, 1.0, at=RATE_WINDOW_S + 1.5) == {}


async def _run(driver: NodeDriver, rounds: int) -> list[int]:
    """Start every dispatched job each round; how many were leased unstarted after each."""
    done: set[str] = set()
    unstarted = []
    for _ in range(rounds):
        await driver.settle()
        fresh = [d for d in driver.dispatched() if d.job_id not in done]
        unstarted.append(len(fresh))
        driver.append(*(started(d) for d in fresh))
        done |= {d.job_id for d in fresh}
        driver.advance(0.1)
    return unstarted


async def test_a_queue_whose_workers_keep_up_gets_a_wider_window(tmp_path: Path) -> None:
    budgets = PlannerBudgets(max_unstarted_per_queue=4, unstarted_horizon_ms=1_000)
    driver = NodeDriver(tmp_path, budgets=budgets, budget=QueueBudget())
    driver.append(*(enqueued(f"j{i}") for i in range(200)))
    # Starts 0.1 s apart: after 4, 4 and 8 starts in the window the limit is 4, 4, then 6 ...
    assert await _run(driver, 6) == [4, 4, 4, 6, 9, 14]
    driver.close()


async def test_with_horizon_zero_the_window_stays_at_max_unstarted(tmp_path: Path) -> None:
    budgets = PlannerBudgets(max_unstarted_per_queue=4, unstarted_horizon_ms=0)
    driver = NodeDriver(tmp_path, budgets=budgets, budget=QueueBudget())
    driver.append(*(enqueued(f"j{i}") for i in range(200)))
    assert await _run(driver, 6) == [4] * 6
    driver.close()
