"""The RocksDB index of one events partition: its families, keys, writes, purges and tallies."""

from evsched.adapters.index.readonly import ReadOnlyIndex
from evsched.adapters.index.store import IndexBatch, PartitionIndex

__all__ = ["IndexBatch", "PartitionIndex", "ReadOnlyIndex"]
