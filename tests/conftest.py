"""Test-wide setup.

Triton kernels run on CPU only under the interpreter, and the switch must be set before triton is
first imported, so it is set here, before any test module imports a kernel.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# Unit tests use tiny models: with two intra-op threads on a 2-core machine that is also running
# other work, a 48x48 matmul waits on thread hand-offs (measured 10x slower), so use one thread.
torch.set_num_threads(1)
