"""Test helpers for evsched and its users: in-memory twins of the seams, a frozen clock, NodeDriver.

Each twin behaves as ``tests/contract`` proves the real adapter does.
"""

from evsched.testing.driver import NodeDriver
from evsched.testing.follow import MemoryJobFeed
from evsched.testing.memory import (
    FrozenClock,
    MemoryFeed,
    MemoryLog,
    MemoryPools,
    MemoryReader,
    Written,
)
from evsched.testing.outbox import MemoryBroker, MemoryOutbox, SimulatedCrash, Transaction
from evsched.testing.partition_log import MemoryPartitionLog

__all__ = [
    "FrozenClock",
    "MemoryBroker",
    "MemoryFeed",
    "MemoryJobFeed",
    "MemoryLog",
    "MemoryOutbox",
    "MemoryPartitionLog",
    "MemoryPools",
    "MemoryReader",
    "NodeDriver",
    "SimulatedCrash",
    "Transaction",
    "Written",
]
