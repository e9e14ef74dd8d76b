"""TurboQuant k8v4 decode at head_dim 256: sndr's CUDA page kernel vs sndr's Triton kernel.

    python3 benchmarks/bench_tq_decode_d256.py

vLLM 0.32.0's own k8v4 decode and the full cell grid are in ``bench_tq_decode.py``
(head_dim 128). This one answers a narrower question: at head_dim 256 (Gemma-style
models), is the CUDA path worth taking over the Triton kernel? Both run the same
``kernels.decode_attention`` call under CUDA-graph replay (``SNDR_TQ_BACKEND``
switches them), on the same paged cache (random fp8 keys and 4-bit codes, page 16,
Hk 8, a random page permutation), ``triton.testing.do_bench`` medians with L2
flushed before each call. Prints time, GB/s of cache bytes and % of the device's
copy bandwidth measured in the same run, and the speed-up over Triton.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sndr.kernels.turboquant_k8v4 import kernels  # noqa: E402
from sndr.kernels.turboquant_k8v4._layout import Layout  # noqa: E402

D, HK, PAGE = 256, 8, 16


def copy_bandwidth() -> float:
    n = 2 * 1024**3
    a = torch.empty(n, dtype=torch.uint8, device="cuda").random_()
    b = torch.empty_like(a)
    ms = triton.testing.do_bench(lambda: b.copy_(a), warmup=25, rep=200, return_mode="median")
    return 2 * n / (ms * 1e-3) / 1e9


def graph_time(fn) -> float:
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return triton.testing.do_bench(g.replay, warmup=25, rep=100, return_mode="median") * 1e3


def main() -> int:
    if not torch.cuda.is_available():
        print("needs a CUDA GPU")
        return 2
    p = torch.cuda.get_device_properties(0)
    print(f"device: {p.name}, {p.multi_processor_count} SMs, torch {torch.__version__}, triton {triton.__version__}")
    bw = copy_bandwidth()
    print(f"copy bandwidth: {bw:.0f} GB/s (read + write)")
    slot = Layout(D).slot_size_aligned
    gen = torch.Generator(device="cuda").manual_seed(0)
    for hq in (32, 64):
        for b, ctx in ((8, 8192), (32, 8192), (8, 32768), (32, 32768)):
            nb = b * ctx // PAGE
            cache = torch.randint(0, 120, (nb, PAGE, HK, slot), dtype=torch.uint8, device="cuda", generator=gen)
            cache[..., D + D // 2:] = 0  # scale 0.01, zero 0 (finite, in range)
            cache.view(torch.int16)[..., (D + D // 2) // 2] = torch.tensor(0.01, dtype=torch.float16).view(torch.int16)
            bt = torch.randperm(nb, device="cuda", generator=gen).to(torch.int32).reshape(b, ctx // PAGE)
            sl = torch.full((b,), ctx, dtype=torch.int32, device="cuda")
            q = torch.randn(b, hq, D, device="cuda", generator=gen).to(torch.bfloat16)
            out = torch.empty(b, hq, D, dtype=torch.bfloat16, device="cuda")
            ws = torch.empty(b * hq * 32 * (D + 1), device="cuda")
            t = {}
            for backend in ("cuda", "triton"):
                os.environ["SNDR_TQ_BACKEND"] = backend
                t[backend] = graph_time(lambda: kernels.decode_attention(q, cache, bt, sl, D**-0.5, out=out,
                                                                         workspace=ws, max_splits=32))
            nbytes = b * HK * ctx * slot
            gbs = {k: nbytes / v / 1e3 for k, v in t.items()}
            print(f"Hq/Hk {hq}/{HK} B={b} ctx={ctx // 1024}K: CUDA {t['cuda']:.1f} us {gbs['cuda']:.0f} GB/s "
                  f"({100 * gbs['cuda'] / bw:.0f}%) | Triton {t['triton']:.1f} us {gbs['triton']:.0f} GB/s "
                  f"({100 * gbs['triton'] / bw:.0f}%) | x{t['triton'] / t['cuda']:.2f}", flush=True)
            del cache
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
