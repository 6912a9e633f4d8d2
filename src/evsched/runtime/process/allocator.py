"""glibc's allocator for evsched's long-running processes: hand freed memory back to the system.

The 3M-job soak (docs/bench-log.md) saw a node's RSS creep up by some 40 MB over two hours
while its live objects stayed flat: calling ``malloc_trim(0)`` from a debugger at the end of the
load took the node from 226 to 184 MB, the worker from 128 to 112 MB and the API from 183 to
174 MB. glibc keeps freed memory for reuse, and its mmap threshold rises to the largest block
ever freed, so the large short-lived buffers of a busy process (produce batches, changelog
batches, RocksDB write batches) end up on the main heap, where they fragment it.

So each process pins the mmap threshold (blocks from this size up are mapped and unmapped on
their own) and a daemon thread trims the heap now and then. Elsewhere than glibc both are no-ops,
and ``EVSCHED_MALLOC_TUNING=off`` leaves glibc as it is (to compare, or with another allocator).
"""

from __future__ import annotations

import ctypes
import os
import threading
import time
from dataclasses import dataclass

from evsched.settings import MALLOC_TUNING_ENV, switch_env

# mallopt's parameter number for the mmap threshold (malloc.h); setting it also stops glibc
# from raising the threshold (and the trim threshold) as large blocks are freed.
M_MMAP_THRESHOLD = -3
# glibc's own starting value: a produce or changelog batch (up to 512 KiB) is mapped for itself.
MMAP_THRESHOLD_BYTES = 128 << 10
# A trim walks the heap's free chunks and returns whole free pages (a few ms on a 200 MB heap).
TRIM_EVERY_S = 60.0
THREAD_NAME = "evsched-malloc-trim"


@dataclass(frozen=True, slots=True)
class AllocatorTuning:
    """What tune_allocator did: the pinned threshold and the trimming thread (None if not asked)."""

    mmap_threshold: int
    trimmer: threading.Thread | None


def glibc() -> ctypes.CDLL | None:
    """The process's C library when it is glibc (it has ``malloc_trim`` and ``mallopt``)."""
    libc = ctypes.CDLL(None)  # the symbols already loaded: the interpreter's own C library
    return libc if hasattr(libc, "malloc_trim") and hasattr(libc, "mallopt") else None


def tune_allocator(*, trim_every_s: float | None = TRIM_EVERY_S) -> AllocatorTuning | None:
    """Pin the mmap threshold and start trimming every ``trim_every_s``; call once at start.

    None when the C library is not glibc, when glibc refused the threshold, or when
    ``EVSCHED_MALLOC_TUNING`` is ``off`` (SettingsError when it is neither on nor off).
    """
    if not switch_env(os.environ, MALLOC_TUNING_ENV):
        return None
    libc = glibc()
    if libc is None or libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) != 1:
        return None
    trimmer = None
    if trim_every_s is not None:
        trimmer = threading.Thread(
            target=_trim_forever, args=(libc, trim_every_s), name=THREAD_NAME, daemon=True
        )
        trimmer.start()
    return AllocatorTuning(mmap_threshold=MMAP_THRESHOLD_BYTES, trimmer=trimmer)


def release_free_memory(libc: ctypes.CDLL | None = None) -> bool:
    """Return the heap's free pages to the system now; True if any were returned."""
    libc = libc or glibc()
    return libc is not None and libc.malloc_trim(0) == 1


def _trim_forever(libc: ctypes.CDLL, every_s: float) -> None:
    # ctypes lets go of the GIL for the call; the thread ends with the process (daemon).
    while True:
        time.sleep(every_s)
        release_free_memory(libc)
