"""Kernel tests run Triton through its CPU interpreter when there is no GPU.

Triton picks interpreter or compiler when a function is decorated, i.e. when a
kernel module is imported, so the switch must be set before any test module
of this folder imports one.

The GDN CPU modules' shared preamble lives here, once:

* ``pytestmark = pytest.mark.cpu_interpreter``: the module's tests run only under
  the interpreter; skipped (saying why) where a GPU is present (its ``*_gpu.py``
  twin runs there) or where triton was imported, compiled, before this file could
  set ``TRITON_INTERPRET=1``;
* ``pytestmark = pytest.mark.triton_interpreter``: the module runs on the GPU or,
  without one, under the interpreter; skipped only in the second case;
* under the interpreter, its scalar-index fix (``_interp.fix_scalar_index``) is
  applied once, before any test runs.
"""

import os
import sys

import pytest

#: Why Triton's interpreter cannot serve this session (None: it can, or a GPU runs the kernels).
INTERPRETER_WHY: str | None = None
try:
    import torch

    _CUDA = torch.cuda.is_available()
    if not _CUDA:
        if sys.modules.get("triton") is not None and os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
            INTERPRETER_WHY = ("triton was imported (compiled mode) before TRITON_INTERPRET=1 could be set; "
                               "run tests/kernels alone")
        else:
            os.environ.setdefault("TRITON_INTERPRET", "1")
except ImportError:  # the test modules skip themselves
    _CUDA = False


def pytest_configure(config):
    config.addinivalue_line("markers", "cpu_interpreter: runs only under Triton's CPU interpreter (no GPU)")
    config.addinivalue_line("markers", "triton_interpreter: runs on the GPU or under Triton's CPU interpreter")
    config.addinivalue_line("markers", "routed: a GDN GPU test that runs PK0003's entries with their cell routing on")
    if not _CUDA and INTERPRETER_WHY is None:
        try:
            from sndr.kernels.turboquant_k8v4 import _interp

            _interp.fix_scalar_index()
        except ImportError:  # no triton: the modules skip themselves
            pass


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.get_closest_marker("cpu_interpreter") is not None:
            if _CUDA:
                item.add_marker(pytest.mark.skip(reason="CPU-interpreter tests (a GPU is present: the *_gpu.py files)"))
            elif INTERPRETER_WHY:
                item.add_marker(pytest.mark.skip(reason=INTERPRETER_WHY))
        elif item.get_closest_marker("triton_interpreter") is not None and not _CUDA and INTERPRETER_WHY:
            item.add_marker(pytest.mark.skip(reason=INTERPRETER_WHY))
