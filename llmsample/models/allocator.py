"""The C allocator's thresholds, raised once per process before decoding.

glibc serves a block over its mmap threshold (128 KiB, raised to the largest block freed so far)
with a fresh mapping and unmaps it on free, and returns the heap's free top to the kernel once it
passes the trim threshold. A decoding step makes and frees the same [rows, vocab] temporaries
every time (a float64 CDF of 16 x 49k is 6 MiB), so every step faulted them back in page by page,
zero-filled by the kernel: a batch-16 run of 512 tokens took 130,000 page faults, and the sampler's
draw took 6.7 ms a step against 1.0 ms with the blocks kept. Fixed thresholds keep them in the
heap for the next step, at the cost of holding up to ``TRIM`` of freed memory."""

from __future__ import annotations

import ctypes
import os
import sys

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP = 32 << 20
"""Blocks up to 32 MiB come from the heap; bigger ones (model weights) stay mappings."""
TRIM = 256 << 20

_done = False


def keep_freed_blocks() -> bool:
    """Set glibc's thresholds unless the user set them (``MALLOC_MMAP_THRESHOLD_``,
    ``MALLOC_TRIM_THRESHOLD_`` or ``GLIBC_TUNABLES``); returns whether they are set. Elsewhere
    (macOS, musl) nothing."""
    global _done
    if _done:
        return True
    tunables = os.environ.get("GLIBC_TUNABLES", "")
    if (
        not sys.platform.startswith("linux")
        or any(name in os.environ for name in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_"))
        or any(name in tunables for name in ("malloc.mmap_threshold", "malloc.trim_threshold"))
    ):
        return False
    mallopt = getattr(ctypes.CDLL(None), "mallopt", None)
    if mallopt is None:
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    _done = bool(mallopt(M_MMAP_THRESHOLD, MMAP)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM))
    return _done


def return_freed_memory() -> bool:
    """Hand the heap's free memory back to the kernel now (glibc's ``malloc_trim``): after a load
    that freed a model's worth of blocks (weights replaced by reordered copies), which the raised
    trim threshold would otherwise keep resident. Returns whether anything was released."""
    if not sys.platform.startswith("linux"):
        return False
    trim = getattr(ctypes.CDLL(None), "malloc_trim", None)
    if trim is None:
        return False
    trim.argtypes = [ctypes.c_size_t]
    return bool(trim(0))
