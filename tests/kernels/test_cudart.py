"""``sndr.kernels._cudart`` on the CPU against stand-in drivers (its GPU paths run in every kernel test on a device)."""

from __future__ import annotations

from sndr.kernels import _cudart


def test_a_function_keeps_the_largest_shared_memory_any_caller_asked(monkeypatch):
    """Kernels of one name share the driver function and its max-dynamic-shared-memory attribute: a later, smaller
    ask must not lower it under an earlier Kernel (whose launches would then fail with "invalid argument")."""
    calls = []

    class Driver:
        def cuModuleLoadData(self, handle, cubin):
            return 0

        def cuModuleGetFunction(self, func, module, name):
            return 0

        def cuFuncSetAttribute(self, func, attr, value):
            calls.append((attr, value))
            return 0

    monkeypatch.setattr(_cudart, "_driver", lambda: Driver())
    m = _cudart.Module(b"\x7fELF", "probe")
    big = m.kernel("k", 115_000)
    small = m.kernel("k", 106_000)
    other = m.kernel("j", 50_000)
    assert (big.smem, small.smem, other.smem) == (115_000, 106_000, 50_000) and big is not small
    assert calls == [(8, 115_000), (8, 50_000)] and m.smem_max == {"k": 115_000, "j": 50_000}
    assert m.kernel("k", 120_000).smem == 120_000 and calls[-1] == (8, 120_000)
    assert m.kernel("k", 106_000) is small and len(calls) == 3
