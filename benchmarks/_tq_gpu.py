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


def clean_cold_us(run, n: int = 100, flush_mb: int = 256) -> float:
    """Median microseconds of ``run()`` (event-timed) after an L2 flush that leaves only clean lines.

    ``triton.testing.do_bench`` flushes the L2 by *writing* 256 MB: the timed call
    then starts with an L2 full of dirty lines and pays their write-back (about one
    L2 of extra DRAM traffic, some 50 MB on an H100/H200) on top of its own bytes.
    Here the flush *reads* ``flush_mb`` MB instead (dirty lines are written back
    during the flush, outside the timed region), which is what a decode layer sees
    after layers that mostly read weights.
    """
    buf = torch.ones(flush_mb * 2**20 // 4, dtype=torch.int32, device="cuda")
    for _ in range(3):
        run()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(n)]
    for a, b in ev:
        buf.sum()
        a.record()
        run()
        b.record()
    torch.cuda.synchronize()
    ts = sorted(a.elapsed_time(b) for a, b in ev)
    return ts[len(ts) // 2] * 1e3


def synthetic_cache(num_blocks: int, page: int, hk: int, d: int, gen: torch.Generator) -> torch.Tensor:
    """A k8v4 cache of random fp8 keys (small, finite) and 4-bit codes, scale 0.01, zero 0: timing only."""
    slot = Layout(d).slot_size_aligned
    c = torch.randint(0, 120, (num_blocks, page, hk, slot), dtype=torch.uint8, device="cuda", generator=gen)
    c[..., d + d // 2:] = 0
    c.view(torch.int16)[..., (d + d // 2) // 2] = torch.tensor(0.01, dtype=torch.float16).view(torch.int16)
    return c
