"""evsched's own exceptions, so that third-party errors stop at the adapter that met them."""

from __future__ import annotations


class EvschedError(Exception):
    """Base of every error evsched raises on purpose."""


class ContractError(EvschedError):
    """The packaged Avro schemas are missing, unreadable or disagree with each other."""


class DecodeError(EvschedError):
    """Bytes that are not a valid evsched record; ``reason`` says why, in one line."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class EncodeError(EvschedError):
    """A value that cannot be written under its schema (e.g. an int beyond 64 bits)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class InvalidEnqueue(EvschedError, ValueError):
    """A client call that would write a bad event, so nothing was written; ``field`` says where."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


class UnknownTask(InvalidEnqueue):
    """Enqueue by name of a task the app does not define."""

    def __init__(self, name: str) -> None:
        super().__init__("task", f"no task named {name!r} is registered with this app")
        self.name = name


class UnknownQueue(InvalidEnqueue):
    """Enqueue (or a schedule) on a queue no operator declared: its dispatch topic is missing."""

    def __init__(self, queue: str, reason: str) -> None:
        super().__init__("queue", reason)
        self.queue = queue


class InvalidTask(EvschedError, ValueError):
    """A task definition with a bad option (e.g. ``max_attempts=0``)."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


class PublishError(EvschedError):
    """The broker did not acknowledge a write: the event may or may not be in the log."""


class NotEnoughReplicas(PublishError):
    """The write's partition has no leader or fewer in-sync replicas than its topic's
    ``min.insync.replicas``: the broker acknowledges nothing it could lose. Retriable once the
    brokers are back; the message names the partition and its replicas."""

    retriable = True


class NoJobReader(EvschedError):
    """A read (``get_job``) on an app that was given no JobReader."""


class StoreError(EvschedError):
    """The RocksDB index could not be opened or written."""


class IndexVersionMismatch(StoreError):
    """A partition's index was written by another fold version: it must be rebuilt from the log."""

    def __init__(self, partition: int, found: int, expected: int) -> None:
        super().__init__(
            f"index of partition {partition} was built by fold version {found}, "
            f"this is {expected}: it must be rebuilt from the log"
        )
        self.partition = partition
        self.found = found
        self.expected = expected


# Broker-side failures, mapped from the Kafka client's errors in ``evsched.adapters``: nothing
# outside the adapters sees (or catches) a Kafka client type.


class BrokerUnavailable(EvschedError):
    """The broker could not be reached, or gave up on a request; retrying later may succeed."""


class BrokerAccessRefused(EvschedError):
    """The broker refused this client's TLS or SASL (an untrusted certificate, a wrong password or
    mechanism): a setting to fix, not an outage, so nothing retries it; the message names it."""


class Fenced(EvschedError):
    """A newer producer holds this transactional id: the partition has another owner now."""


class PartitionRevoked(EvschedError):
    """The partition is no longer assigned to this consumer (a rebalance took it)."""


class RebalanceCommitFailed(EvschedError):
    """The group rebalanced before an offset commit: the commit was refused, nothing was lost."""


class RecordRefused(EvschedError):
    """The broker refused a record itself (too large, its topic missing or not allowed)."""


class RestoreRefused(EvschedError):
    """A partition's index cannot be rebuilt from the log without losing history (retention)."""

    def __init__(self, partition: int, reason: str) -> None:
        super().__init__(f"partition {partition}: {reason}")
        self.partition = partition
        self.reason = reason


class JobFailed(EvschedError):
    """A job whose result was awaited ended without one: ``status`` is dead or cancelled.

    ``error_type``, ``message``, ``category`` and ``traceback`` are those of its last failure
    (None for a job cancelled before any attempt failed).
    """

    def __init__(
        self,
        job_id: str,
        status: str,
        *,
        error_type: str | None = None,
        message: str | None = None,
        category: str | None = None,
        traceback: str | None = None,
    ) -> None:
        detail = f": {error_type}: {message}" if error_type is not None else ""
        super().__init__(f"job {job_id} is {status}{detail}")
        self.job_id = job_id
        self.status = status
        self.error_type = error_type
        self.message = message
        self.category = category
        self.traceback = traceback
