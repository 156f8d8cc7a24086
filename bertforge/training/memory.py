"""Host memory for CPU training: keep the pages of freed tensors instead of faulting them in again.

A training step on CPU allocates and frees the same large tensors every step: activations of
10+ MB, and at base size a 94 MB gradient for the word embeddings (written twice: by the MLM
decoder it is tied to and by the lookup). glibc's malloc serves blocks above its mmap threshold
with fresh pages from the kernel and unmaps them on `free`, so every step pays the page faults of
zero-filling the same memory again, a visible share of a base-size step (see BENCHMARKS.md,
"Pre-training step"). Serving everything from malloc's heap and never trimming it keeps those pages;
the price is that the process keeps its peak resident memory, which a training loop reaches on
every step anyway.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

# mallopt(3) parameters (glibc's malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
_TRIM_NEVER = 2**31 - 1  # an int: the largest threshold mallopt takes
ENV_SWITCH = "BERTFORGE_KEEP_FREED_MEMORY"  # "0" turns it off

_applied = False


def keep_freed_memory() -> bool:
    """Tell glibc's malloc to keep freed memory in the process (no mmap'd blocks, no trimming).

    Process-wide, for the allocations that follow; idempotent. Returns whether it is in effect:
    False where the C library is not glibc (macOS, Windows, musl) or when the environment variable
    BERTFORGE_KEEP_FREED_MEMORY is "0".
    """
    global _applied
    if _applied:
        return True
    if os.environ.get(ENV_SWITCH, "1") == "0" or not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
        libc.gnu_get_libc_version  # present only in glibc  # noqa: B018
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    # mallopt returns 1 on success
    _applied = mallopt(_M_MMAP_MAX, 0) == 1 and mallopt(_M_TRIM_THRESHOLD, _TRIM_NEVER) == 1
    return _applied
