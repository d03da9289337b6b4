"""Test-wide setup.

Triton kernels run on CPU only under the interpreter, and the switch must be set before triton is
first imported, so it is set here, before any test module imports a kernel.
"""

import ctypes
import ctypes.util
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# Unit tests use tiny models: with two intra-op threads on a 2-core machine that is also running
# other work, a 48x48 matmul waits on thread hand-offs (measured 10x slower), so use one thread.
torch.set_num_threads(1)


def _keep_freed_buffers_on_the_heap() -> None:
    """Stop glibc handing freed buffers back to the kernel between the oracles' many allocations.

    The exact-enumeration tests allocate and free buffers of tens of MB thousands of times; by
    default glibc serves each from a fresh ``mmap`` and unmaps it on free, so every buffer is
    page-faulted in again: measured on 2 cores, ``test_lossless[spine-shape3-3-path]`` spent 35 of
    its 62 s in the kernel (11.8 M page faults); served from the heap and never trimmed, it ran in
    28 s (0.2 M faults) for a peak RSS under 1 GB. Only this process: servers the tests start
    keep glibc's defaults. Skipped off glibc.
    """
    name = ctypes.util.find_library("c")
    if name is None:
        return
    libc = ctypes.CDLL(name)
    if not hasattr(libc, "mallopt"):
        return
    m_trim_threshold, m_mmap_threshold = -1, -3  # <malloc.h>
    largest = 2**31 - 1  # mallopt takes an int
    libc.mallopt(m_mmap_threshold, largest)
    libc.mallopt(m_trim_threshold, largest)


_keep_freed_buffers_on_the_heap()
