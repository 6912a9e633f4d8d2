"""Kafka behind the ports: event log, partition log, dispatch feed, job feed, outbox; and topics."""

from evsched.adapters.kafka.clients import KafkaError
from evsched.adapters.kafka.dispatch_feed import KafkaDispatchFeed
from evsched.adapters.kafka.event_log import KafkaEventLog
from evsched.adapters.kafka.job_feed import KafkaJobFeed
from evsched.adapters.kafka.node_transactions import NodeTransactions, PartitionSender
from evsched.adapters.kafka.partition_log import KafkaGroupConsumer, KafkaPartitionLog
from evsched.adapters.kafka.partition_outbox import KafkaOutbox
from evsched.adapters.kafka.rdkafka_group import RdkafkaGroupConsumer
from evsched.adapters.kafka.topics import Topics

__all__ = [
    "KafkaDispatchFeed",
    "KafkaError",
    "KafkaEventLog",
    "KafkaGroupConsumer",
    "KafkaJobFeed",
    "KafkaOutbox",
    "KafkaPartitionLog",
    "NodeTransactions",
    "PartitionSender",
    "RdkafkaGroupConsumer",
    "Topics",
]
