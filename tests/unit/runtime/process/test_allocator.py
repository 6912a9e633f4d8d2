"""glibc's allocator in evsched's processes: the mmap threshold stays pinned where it was set, and
a trim gives free heap pages back. Each case runs in a child so this test process keeps glibc's
defaults."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from evsched.runtime.process import allocator
from evsched.settings import MALLOC_TUNING_ENV

pytestmark = pytest.mark.skipif(allocator.glibc() is None, reason="glibc's allocator only")

# A child that frees a 16 MiB block (which, unpinned, raises glibc's threshold to 16 MiB), then
# allocates 8 MiB and prints how many bytes glibc's mapped blocks grew by. (A block that fits in
# free heap space is taken from the heap whatever the threshold: 8 MiB is more than the imports
# leave free, even when they compile their sources.)
MAPPED_GROWTH = textwrap.dedent(
    """
    import ctypes, sys
    from evsched.runtime.process import allocator

    class MallInfo2(ctypes.Structure):
        _fields_ = [(name, ctypes.c_size_t) for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd",
            "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]

    libc = allocator.glibc()
    libc.mallinfo2.restype = MallInfo2
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    if sys.argv[1] == "tuned":
        assert allocator.tune_allocator(trim_every_s=None) is not None
    libc.free(libc.malloc(16 << 20))
    before = libc.mallinfo2().hblkhd
    block = libc.malloc(8 << 20)
    print(libc.mallinfo2().hblkhd - before)
    libc.free(block)
    """
)

# A child that allocates 40 MB in small blocks, frees all but the last (so the heap's top stays
# in use and only a trim of the middle can give pages back), then trims.
TRIM_RETURNS = textwrap.dedent(
    """
    import ctypes
    from evsched.runtime.process import allocator

    libc = allocator.glibc()
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    blocks = [libc.malloc(2048) for _ in range(20_000)]
    for block in blocks[:-1]:
        libc.free(block)
    print(allocator.release_free_memory(libc))
    """
)


def _child(script: str, *args: str) -> str:
    command = [sys.executable, "-c", script, *args]
    done = subprocess.run(command, check=False, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_a_pinned_threshold_maps_a_large_block_after_a_larger_one_was_freed() -> None:
    assert int(_child(MAPPED_GROWTH, "tuned")) >= 256 << 10


def test_without_pinning_glibc_raises_its_threshold_and_keeps_the_block_on_the_heap() -> None:
    # The control for the case above: glibc's default is what the pin is there to change.
    assert int(_child(MAPPED_GROWTH, "defaults")) == 0


def test_a_trim_returns_the_pages_of_freed_small_blocks() -> None:
    assert _child(TRIM_RETURNS) == "True"


def test_tuning_starts_one_daemon_trimmer_thread() -> None:
    # Pinning here changes only the threshold for large blocks; the thread waits an hour first.
    tuning = allocator.tune_allocator(trim_every_s=3600)
    assert tuning is not None
    assert tuning.mmap_threshold == allocator.MMAP_THRESHOLD_BYTES
    assert tuning.trimmer is not None
    assert tuning.trimmer.daemon
    assert tuning.trimmer.is_alive()
    assert tuning.trimmer.name == allocator.THREAD_NAME


def test_the_switch_leaves_glibc_as_it_is(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(MALLOC_TUNING_ENV, "off")
    assert allocator.tune_allocator(trim_every_s=None) is None
