"""Kafka's default partitioner for keyed records (murmur2), in fewer Python operations per byte.

Every keyed record evsched produces (a worker's two events per job, a node's dispatch record, an
enqueue) goes through it. aiokafka's ``murmur2`` reads the key a byte at a time and masks after
every operation; this one reads it four bytes at a time and masks only where a value can pass 32
bits. The results are the same for every key (``tests/unit/test_kafka_partitioner.py`` checks it
against aiokafka's), as they must be: a job's events land on one partition whoever writes them.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Callable, Sequence

from aiokafka.partitioner import DefaultPartitioner

_SEED = 0x9747B28C
_M = 0x5BD1E995
_MASK = 0xFFFFFFFF


@functools.cache
def _words(count: int) -> Callable[[bytes], tuple[int, ...]]:
    """Unpacks the first ``count`` little-endian 32-bit words of a buffer."""
    return struct.Struct(f"<{count}I").unpack_from


def murmur2(data: bytes) -> int:
    """MurmurHash2 of ``data`` as Kafka's Java client computes it (``Utils.murmur2``)."""
    length = len(data)
    h = _SEED ^ length
    for word in _words(length >> 2)(data):
        k = (word * _M) & _MASK
        h = ((h * _M) & _MASK) ^ (((k ^ (k >> 24)) * _M) & _MASK)
    tail = length & 3
    if tail:
        end = length & ~3
        if tail == 3:
            h ^= data[end + 2] << 16
        if tail >= 2:
            h ^= data[end + 1] << 8
        h = ((h ^ data[end]) * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    return h ^ (h >> 15)


def partition_of(key: bytes, partitions: int) -> int:
    """The partition of ``partitions`` a keyed record goes to."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions


_UNKEYED = DefaultPartitioner()


def key_partitioner(
    key: bytes | None, all_partitions: Sequence[int], available: Sequence[int]
) -> int:
    """aiokafka's ``partitioner`` option: its DefaultPartitioner, with this murmur2."""
    if key is None:
        return int(_UNKEYED(key, all_partitions, available))
    return all_partitions[partition_of(key, len(all_partitions))]
