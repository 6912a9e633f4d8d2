"""Archives: the events log as history files, per-partition folders read as the log would be."""

from evsched.adapters.archive.files import ArchiveError
from evsched.adapters.archive.history_file import HistoryWriter, read_history
from evsched.adapters.archive.partition_log import ArchivePartitionLog

__all__ = ["ArchiveError", "ArchivePartitionLog", "HistoryWriter", "read_history"]
