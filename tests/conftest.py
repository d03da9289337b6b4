"""Test-wide setup.

Triton kernels run on CPU only under the interpreter, and the switch must be set before triton is
first imported, so it is set here, before any test module imports a kernel.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
