"""The worker: takes dispatch records and runs their attempts, fenced, within a slot limit."""

from evsched.runtime.worker.main import kafka_worker, serve_when_reachable
from evsched.runtime.worker.worker import Worker, WorkerConfig

__all__ = ["Worker", "WorkerConfig", "kafka_worker", "serve_when_reachable"]
