"""One owned events partition: fold its records, plan leases within budgets and permits, commit."""

from evsched.runtime.partition.budget import QueueBudget
from evsched.runtime.partition.partition import OwnedPartition
from evsched.runtime.partition.runner import PartitionRunner

__all__ = ["OwnedPartition", "PartitionRunner", "QueueBudget"]
