"""The ``poison`` recording (fold version 7): the index keeps only the newest ``POISON_KEPT``
undecodable records and refused events of a partition. A foreign producer writes garbage and
enqueues of an empty job id (``rejected``: an id that cannot key a timeline) to one partition,
below the bound while ``node-1`` owns it, then, with ``node-2`` the owner after ``node-1`` stopped,
past it; jobs run before, between and after. The recorder checks every index (the replica's, each
node's at the offset it reached) keeps exactly the newest ``POISON_KEPT`` of each kind at or below
that offset; verdicts, states and the undecodable list of the outcome keep them all.
"""

from __future__ import annotations

from replay.scenarios import until_node_past_the_end, until_status
from tests.integration.engine import Stack
from tests.integration.test_retention_poison import flood, produce_to

from evsched.adapters.index.poison import POISON_KEPT

PARTITION = 1
FIRST = 600  # of each kind while node-1 owns the partition: below the bound
EXTRA = 20  # of each kind past the bound, in all
WAIT_S = 600.0  # processes are slow to start on a loaded machine; every wait is on a condition


async def poison(stack: Stack) -> None:
    node = stack.start_node("node-1", "--dispatch-timeout-s", "10")
    stack.start_worker("worker-1", "--lease-s", "3")
    async with stack.app() as app:
        before = [await app.enqueue("s.noop") for _ in range(3)]
        await until_status(stack, before)
        first = await _flood(stack, flood(FIRST, huge=False))
        await stack.wait_node_past(PARTITION, first, timeout_s=WAIT_S)
        assert node.stop() == 0  # node-1's index stops at a prefix below the bound
        stack.start_node("node-2", "--dispatch-timeout-s", "10")
        between = [await app.enqueue("s.noop") for _ in range(3)]
        await until_status(stack, between)
        rest = POISON_KEPT + EXTRA - FIRST
        await _flood(stack, flood(rest, first=FIRST, huge=False))
        after = [await app.enqueue("s.noop") for _ in range(3)]
        await until_status(stack, after)
    await until_node_past_the_end(stack)


async def _flood(stack: Stack, records: list[tuple[str, bytes]]) -> int:
    """Write ``records`` to the partition; wait until the replica folded them: the last offset."""
    offsets = await produce_to(stack, PARTITION, [value for _, value in records])
    await (await stack.replica()).wait_for(PARTITION, offsets[-1], timeout_s=WAIT_S)
    return offsets[-1]
