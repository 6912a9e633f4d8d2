"""evsched: an event-sourced job scheduler for Python services, on Kafka and RocksDB."""

__version__ = "0.1.0.dev0"
