"""evsched's murmur2 partitioner gives aiokafka's (Kafka's) partition for every key."""

from __future__ import annotations

from aiokafka.partitioner import DefaultPartitioner
from aiokafka.partitioner import murmur2 as reference
from hypothesis import given
from hypothesis import strategies as st

from evsched.adapters.kafka_events import partition_for
from evsched.adapters.kafka_partitioner import key_partitioner, murmur2


@given(st.binary(max_size=300))
def test_murmur2_is_kafkas_for_any_bytes(data: bytes) -> None:
    assert murmur2(data) == reference(data)


@given(st.binary(max_size=64), st.integers(min_value=1, max_value=500))
def test_a_keyed_record_goes_where_aiokafkas_partitioner_sends_it(key: bytes, count: int) -> None:
    partitions = list(range(count))
    assert key_partitioner(key, partitions, partitions) == DefaultPartitioner()(
        key, partitions, partitions
    )


def test_known_values_of_kafkas_java_client() -> None:
    # What the Java client's Utils.murmur2 gives (as signed ints): every tail length, longer keys.
    assert murmur2(b"21") == -973932308 & 0xFFFFFFFF
    assert murmur2(b"foobar") == -790332482 & 0xFFFFFFFF
    assert murmur2(b"a-little-bit-long-string") == -985981536 & 0xFFFFFFFF
    assert murmur2(b"a-little-bit-longer-string") == -1486304829 & 0xFFFFFFFF
    assert murmur2(b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8") == -58897971 & 0xFFFFFFFF
    assert murmur2(b"") == 275646681


def test_an_unkeyed_record_goes_to_an_available_partition() -> None:
    assert key_partitioner(None, [0, 1, 2], [2]) == 2


def test_partition_for_a_job_id_is_the_producers() -> None:
    job_id = "0b6c9a52-8a5e-4c2e-9d1f-3e8e2f0d9a11"
    assert partition_for(job_id, 6) == (reference(job_id.encode()) & 0x7FFFFFFF) % 6
