"""TurboQuant k8v4 decode inside a multi-layer CUDA graph, as vLLM runs it.

    python3 benchmarks/bench_tq_decode_layers.py [--layers 8]

``bench_tq_decode.py`` times one decode call per CUDA graph, so every cell
pays the graph launch and the first kernel's ramp once per call. vLLM captures
a whole decode step, one call per layer, in a single graph. This script
captures ``--layers`` calls on as many separate caches (each larger than the
L2, as real layers are) and reports the time per layer against the baseline of
one call per graph, measured in the same run, with the marginal cost of a
layer and its GB/s. Random cache bytes (timing only; correctness is
``bench_tq_decode.py --check`` and ``tests/kernels/test_tq_cuda_gpu.py``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _tq_gpu import copy_bandwidth, device_line, graph_time, synthetic_cache  # noqa: E402

from sndr.kernels.turboquant_k8v4 import dispatch  # noqa: E402
from sndr.kernels.turboquant_k8v4._layout import Layout  # noqa: E402

D, HK, PAGE = 128, 8, 16


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=8)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("needs a CUDA GPU")
        return 2
    print(f"device: {device_line()}")
    bw = copy_bandwidth()
    print(f"copy bandwidth: {bw:.0f} GB/s (read + write)")
    slot = Layout(D).slot_size_aligned
    gen = torch.Generator(device="cuda").manual_seed(0)
    n_layers = args.layers
    for hq in (32, 64):
        for b, ctx in ((8, 8192), (32, 8192), (8, 32768)):
            nb = b * ctx // PAGE
            caches = [synthetic_cache(nb, PAGE, HK, D, gen) for _ in range(n_layers)]
            bt = torch.randperm(nb, device="cuda", generator=gen).to(torch.int32).reshape(b, ctx // PAGE)
            sl = torch.full((b,), ctx, dtype=torch.int32, device="cuda")
            q = torch.randn(b, hq, D, device="cuda", generator=gen).to(torch.bfloat16)
            out = torch.empty(b, hq, D, dtype=torch.bfloat16, device="cuda")
            ws = torch.empty(b * hq * 32 * (D + 1), device="cuda")

            def step(n):
                for i in range(n):
                    dispatch.decode_attention(q, caches[i], bt, sl, D**-0.5, out=out, workspace=ws, max_splits=32)

            t = {n: graph_time(lambda n=n: step(n)) for n in (1, n_layers)}
            nbytes = b * HK * ctx * slot
            per = t[n_layers] / n_layers
            marginal = (t[n_layers] - t[1]) / (n_layers - 1)
            print(f"Hq/Hk {hq}/{HK} B={b} ctx={ctx // 1024}K: one call per graph {t[1]:.1f} us "
                  f"({100 * nbytes / t[1] / 1e3 / bw:.0f}%) | {n_layers} layers per graph {per:.1f} us/layer "
                  f"({100 * nbytes / per / 1e3 / bw:.0f}%), x{t[1] / per:.2f} | marginal layer {marginal:.1f} us "
                  f"({nbytes / marginal / 1e3:.0f} GB/s, {100 * nbytes / marginal / 1e3 / bw:.0f}%)", flush=True)
            caches = None  # frees its GPU buffers; closures above still name it, so no del
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
