"""Stand-in for vLLM's ``flash_linear_attention/ops/op.py`` (``exp``, ``log``) when loading the baseline copies.

Jitted wrappers rather than the ``tl`` functions themselves, so that Triton's
interpreter (which patches ``tl`` names) runs them too.
"""

import triton
import triton.language as tl


@triton.jit
def exp(x):
    return tl.exp(x)


@triton.jit
def log(x):
    return tl.log(x)
