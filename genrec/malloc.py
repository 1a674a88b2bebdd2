"""glibc allocator settings for CPU training.

By default glibc hands every freed block above 32 MB back to the kernel, which zero-fills the
pages again when the next step allocates the same tensors: on CPU that page-fault time is 15%
of a CE step and 30% of a pairwise-APAO step (`sys_share` in benchmarks/objectives.py). With
mmap off and trimming at its maximum, freed memory stays in the heap and is reused; the peak
resident memory grows by the heap's fragmentation (a few hundred MB at most in our runs).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4  # <malloc.h>


def glibc_mallopt():
    """glibc's `mallopt`, or None (not Linux, or another C library such as musl)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        mallopt = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").mallopt
    except (OSError, AttributeError):
        return None
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return mallopt


def keep_freed_memory() -> bool:
    """Apply the settings to this process (and processes it forks); False where not glibc."""
    mallopt = glibc_mallopt()
    return mallopt is not None and bool(mallopt(M_MMAP_MAX, 0)) and bool(mallopt(M_TRIM_THRESHOLD, 2**31 - 1))
