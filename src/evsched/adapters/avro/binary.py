"""Avro binary-encoding primitives (spec 1.11) that the compiled record writers and readers call.

Longs are zigzag varints. Writing one is a table lookup per 14 bits instead of a loop per 7; reading
one is a loop only past its first byte. Anything a compiled reader does not read exactly as
fastavro would (a varint longer than ten bytes, a negative length) raises :class:`Unusual`, so the
codec hands those bytes to fastavro, whose reading is the reference.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Final

_CHUNK: Final = 14
_CHUNK_MASK: Final = (1 << _CHUNK) - 1
_LONG_LIMIT: Final = 1 << 64


class Unusual(Exception):
    """Bytes or a value this fast path leaves to fastavro (it may accept or reject them)."""


def _varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


# LAST[z]: the varint of z < 2**14 (one or two bytes). MORE[c]: 14 bits with more to follow.
LAST: Final = tuple(_varint(value) for value in range(1 << _CHUNK))
MORE: Final = tuple(
    bytes(((chunk & 0x7F) | 0x80, (chunk >> 7) | 0x80)) for chunk in range(1 << _CHUNK)
)
# LENGTH[n]: the encoded length prefix of n < 2**13 bytes (a long, so zigzagged: 2n).
LENGTH: Final = tuple(LAST[2 * n] for n in range(1 << (_CHUNK - 1)))
SHORT_LENGTH: Final = len(LENGTH)
SMALL: Final = len(LAST)
# ZIGZAG[b]: the long in the one-byte varint b < 0x80.
ZIGZAG: Final = tuple((byte >> 1) ^ -(byte & 1) for byte in range(0x80))

# STRING_PREFIX[n]: the length prefix of an ASCII string of n < 64 characters, as one character.
STRING_PREFIX: Final = tuple(chr(2 * n) for n in range(64))

pack_double = struct.Struct("<d").pack
unpack_double = struct.Struct("<d").unpack_from


def big_varint(zigzag: int) -> bytes:
    """The varint of a zigzagged long of 2**14 or more; OverflowError past 64 bits."""
    if zigzag < 1 << 28:
        return MORE[zigzag & _CHUNK_MASK] + LAST[zigzag >> 14]
    if zigzag < 1 << 42:
        return MORE[zigzag & _CHUNK_MASK] + MORE[(zigzag >> 14) & _CHUNK_MASK] + LAST[zigzag >> 28]
    if zigzag >= _LONG_LIMIT:
        raise OverflowError("not an Avro long: beyond 64 bits")
    out = bytearray()
    while zigzag >= 1 << _CHUNK:
        out += MORE[zigzag & _CHUNK_MASK]
        zigzag >>= _CHUNK
    out += LAST[zigzag]
    return bytes(out)


def read_long(data: bytes, pos: int) -> tuple[int, int]:
    """The long whose varint starts at ``pos``, and the position after it.

    fastavro accumulates into 64 bits, so an eleventh byte or bits past the 64th would wrap there:
    such varints are :class:`Unusual` here. Up to ten bytes, both read the same number.
    """
    byte = data[pos]
    value = byte & 0x7F
    shift = 7
    pos += 1
    while byte & 0x80:
        if shift > 63:
            raise Unusual("varint longer than ten bytes")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        shift += 7
    if value >= _LONG_LIMIT:
        raise Unusual("varint beyond 64 bits")
    return (value >> 1) ^ -(value & 1), pos


def read_size(data: bytes, pos: int) -> tuple[int, int]:
    """A length or block count that needs more than one byte, or is negative (then Unusual)."""
    size, pos = read_long(data, pos)
    if size < 0:
        raise Unusual("negative length or block count")
    return size, pos


def ascii_strings(items: Sequence[str]) -> bytes | None:
    """The encoded items of a non-empty array of strings (each its length, then its bytes) when
    they are ASCII and all of one length below 64, as event ids are; else None.

    Then every length prefix is one character, and one join encodes them all, where writing the
    strings one by one costs a dozen steps each (a job state holds up to 16 event ids).
    """
    size = len(items[0])
    if size >= len(STRING_PREFIX) or len(set(map(len, items))) != 1:
        return None
    prefix = STRING_PREFIX[size]
    joined = prefix + prefix.join(items)
    return joined.encode() if joined.isascii() else None
