"""The client library: define tasks, enqueue jobs, cancel, requeue and schedule them."""

from evsched.adapters.kafka.event_log import KafkaEventLog
from evsched.client.app import App
from evsched.client.batch import BatchResult, Outcome
from evsched.client.context import Context
from evsched.client.snooze import Snooze
from evsched.client.task import EnqueueCall, Task, TaskOptions
from evsched.client.workflows import Chain, Group, WorkflowHandle, chain, group
from evsched.core.events import RetryPolicy, TraceContext
from evsched.ports import Appended, EventLog, JobReader

__all__ = [
    "App",
    "Appended",
    "BatchResult",
    "Chain",
    "Context",
    "EnqueueCall",
    "EventLog",
    "Group",
    "JobReader",
    "KafkaEventLog",
    "Outcome",
    "RetryPolicy",
    "Snooze",
    "Task",
    "TaskOptions",
    "TraceContext",
    "WorkflowHandle",
    "chain",
    "group",
]
