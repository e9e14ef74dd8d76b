"""TurboQuant k8v4 decode at head_dim 256: sndr's CUDA page kernel vs sndr's Triton kernel.

    python3 benchmarks/bench_tq_decode_d256.py

vLLM 0.32.0's own k8v4 decode and the full cell grid are in ``bench_tq_decode.py``
(head_dim 128). This one answers a narrower question: at head_dim 256 (Gemma-style
models), is the CUDA path worth taking over the Triton kernel? Both run the same
``dispatch.decode_attention`` call under CUDA-graph replay (``SNDR_TQ_BACKEND``
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _tq_gpu import copy_bandwidth, device_line, graph_time, synthetic_cache  # noqa: E402

from sndr.kernels.turboquant_k8v4 import dispatch  # noqa: E402
from sndr.kernels.turboquant_k8v4._layout import Layout  # noqa: E402

D, HK, PAGE = 256, 8, 16


def main() -> int:
    if not torch.cuda.is_available():
        print("needs a CUDA GPU")
        return 2
    print(f"device: {device_line()}")
    bw = copy_bandwidth()
    print(f"copy bandwidth: {bw:.0f} GB/s (read + write)")
    slot = Layout(D).slot_size_aligned
    gen = torch.Generator(device="cuda").manual_seed(0)
    for hq in (32, 64):
        for b, ctx in ((8, 8192), (32, 8192), (8, 32768), (32, 32768)):
            nb = b * ctx // PAGE
            cache = synthetic_cache(nb, PAGE, HK, D, gen)
            bt = torch.randperm(nb, device="cuda", generator=gen).to(torch.int32).reshape(b, ctx // PAGE)
            sl = torch.full((b,), ctx, dtype=torch.int32, device="cuda")
            q = torch.randn(b, hq, D, device="cuda", generator=gen).to(torch.bfloat16)
            out = torch.empty(b, hq, D, dtype=torch.bfloat16, device="cuda")
            ws = torch.empty(b * hq * 32 * (D + 1), device="cuda")
            t = {}
            for backend in ("cuda", "triton"):
                os.environ["SNDR_TQ_BACKEND"] = backend
                t[backend] = graph_time(lambda: dispatch.decode_attention(q, cache, bt, sl, D**-0.5, out=out,
                                                                         workspace=ws, max_splits=32))
            nbytes = b * HK * ctx * slot
            gbs = {k: nbytes / v / 1e3 for k, v in t.items()}
            print(f"Hq/Hk {hq}/{HK} B={b} ctx={ctx // 1024}K: CUDA {t['cuda']:.1f} us {gbs['cuda']:.0f} GB/s "
                  f"({100 * gbs['cuda'] / bw:.0f}%) | Triton {t['triton']:.1f} us {gbs['triton']:.0f} GB/s "
                  f"({100 * gbs['triton'] / bw:.0f}%) | x{t['triton'] / t['cuda']:.2f}", flush=True)
            cache = None  # frees its GPU buffers; closures above still name it, so no del
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
