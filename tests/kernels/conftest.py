"""Kernel tests run Triton through its CPU interpreter when there is no GPU.

Triton picks interpreter or compiler when a function is decorated, i.e. when a
kernel module is imported, so the switch must be set before any test module
of this folder imports one.
"""

import os

try:
    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
except ImportError:  # the test modules skip themselves
    pass
