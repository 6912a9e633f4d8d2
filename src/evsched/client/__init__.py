"""The client library: define tasks, enqueue jobs, cancel, requeue and schedule them."""

from evsched.adapters.kafka_log import KafkaEventLog
from evsched.client.app import App
from evsched.client.batch import BatchResult, Outcome
from evsched.client.context import Context
from evsched.client.task import EnqueueCall, Task, TaskOptions
from evsched.core.events import RetryPolicy, TraceContext
from evsched.ports import Appended, EventLog, JobReader

__all__ = [
    "App",
    "Appended",
    "BatchResult",
    "Context",
    "EnqueueCall",
    "EventLog",
    "JobReader",
    "KafkaEventLog",
    "Outcome",
    "RetryPolicy",
    "Task",
    "TaskOptions",
    "TraceContext",
]
