"""Pieces the TurboQuant GPU benchmarks share: device line, copy bandwidth,
graph-replay timing, a synthetic k8v4 cache."""

from __future__ import annotations

import torch
import triton

from sndr.kernels.turboquant_k8v4._layout import Layout


def device_line() -> str:
    p = torch.cuda.get_device_properties(0)
    return f"{p.name}, {p.multi_processor_count} SMs, torch {torch.__version__}, triton {triton.__version__}"


def copy_bandwidth(rep: int = 200) -> float:
    """GB/s of a 2 GiB device-to-device copy, bytes read + written."""
    n = 2 * 1024**3
    a = torch.empty(n, dtype=torch.uint8, device="cuda").random_()
    b = torch.empty_like(a)
    ms = triton.testing.do_bench(lambda: b.copy_(a), warmup=25, rep=rep, return_mode="median")
    return 2 * n / (ms * 1e-3) / 1e9


def graph_time(fn) -> float:
    """Median microseconds of ``fn`` replayed from a CUDA graph (L2 flushed before each call).

    ``fn`` runs once eagerly first, so kernels are built and loaded outside the capture.
    """
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return triton.testing.do_bench(g.replay, warmup=25, rep=100, return_mode="median") * 1e3


def synthetic_cache(num_blocks: int, page: int, hk: int, d: int, gen: torch.Generator) -> torch.Tensor:
    """A k8v4 cache of random fp8 keys (small, finite) and 4-bit codes, scale 0.01, zero 0: timing only."""
    slot = Layout(d).slot_size_aligned
    c = torch.randint(0, 120, (num_blocks, page, hk, slot), dtype=torch.uint8, device="cuda", generator=gen)
    c[..., d + d // 2:] = 0
    c.view(torch.int16)[..., (d + d // 2) // 2] = torch.tensor(0.01, dtype=torch.float16).view(torch.int16)
    return c
