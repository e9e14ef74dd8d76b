#!/usr/bin/env python3
"""In situ: vLLM 0.32.0's own TurboQuant attention layer, with sndr's plugins and without.

    python3 -m tests.patches.test_mtp_routing --make-baselines   # once, where the 0.32.0 tree is cached
    python3 benchmarks/bench_tq_layer.py [--quick] [--json OUT.json]   # on the GPU host, .baselines carried

The layer is ``TurboQuantAttentionImpl.forward`` and ``TurboQuantMetadataBuilder.build``
executed from the 0.32.0 wheel's ``turboquant_attn.py`` (the shipped text patches applied,
as vLLM runs it), with its Triton kernels from the wheel, and stand-ins only for what the
GPU host lacks (vLLM's config, logger and workspace manager: a preallocated workspace as
vLLM's own; the harness of tests/patches/test_mtp_routing.py). Same inputs, same cache
(written by vLLM's own store) for both sides:

* **unpatched**: vLLM's build and forward, vLLM's decode kernel;
* **patched**: PK0002's two wrappers installed by sndr's RuntimePatcher, and PK0001's
  decode in the layer module's namespace (what its runtime patch replaces), canaries on.

Batches: a plain decode batch (1 token per request) and a uniform K + 1 verify batch (MTP).
Timing (``triton.testing.do_bench`` medians, L2 flushed before each call): where vLLM runs a
batch inside its FULL CUDA graphs (decode batches; patched verify batches, which PK0002
makes decodes) the forward is captured and replayed; vLLM's verify path is a prefill (a
host loop over the requests), which vLLM runs outside its FULL graphs, so it is timed
eagerly. ``build`` is the metadata builder's host time (median of 200 calls).

Projection per decode step, attention layers only: layer count x forward time, for a
40-layer attention-only model (Hq/Hk 32/8, head dim 128) and Qwen3.5/3.6-35B-A3B (40
layers: 10 gated-attention layers with Hq/Hk 16/2, head dim 256, the other 30 Gated
DeltaNet, not counted here).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import _tq_gpu  # noqa: E402
import torch  # noqa: E402
import triton  # noqa: E402

from tests.patches import test_mtp_routing as harness_mod  # noqa: E402

MODELS = {  # name: (Hq, Hk, head dim, attention layers, note)
    "attn40": (32, 8, 128, 40, "40-layer attention-only model"),
    "qwen35-35b-a3b": (16, 2, 256, 10, "Qwen3.5/3.6-35B-A3B: 10 gated-attention layers of 40"),
}
PAGE, CTX, K = 16, 8192, 3


class Workspace:
    """vLLM's WorkspaceManager as the layer sees it: buffers allocated once, handed out again."""

    def __init__(self):
        self.bufs: dict = {}

    def get_simultaneous(self, *specs):
        out = []
        for i, (shape, dtype) in enumerate(specs):
            key = (i, tuple(shape), dtype)
            if key not in self.bufs:
                self.bufs[key] = torch.empty(shape, dtype=dtype, device="cuda")
            out.append(self.bufs[key])
        return out


def _host_us(fn, n: int = 200) -> float:
    ts = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e6


def measure(h, hq, hk, d, b, kind: str, patched: bool, vllm_decode, sndr_decode, small_batch=None) -> dict:
    """One cell; ``small_batch``: verify_wg.SMALL_BATCH for the call (() = the route before round 11: the per-warp
    kernel at <= 16 rows per KV head at every batch)."""
    from sndr.kernels.turboquant_k8v4 import verify_wg

    keep = verify_wg.SMALL_BATCH
    if small_batch is not None:
        verify_wg.SMALL_BATCH = small_batch
    try:
        return _measure(h, hq, hk, d, b, kind, patched, vllm_decode, sndr_decode)
    finally:
        verify_wg.SMALL_BATCH = keep


def _measure(h, hq, hk, d, b, kind: str, patched: bool, vllm_decode, sndr_decode) -> dict:
    m = h.m
    k = K if kind == "verify" else 0
    qlens = [k + 1] * b
    x = harness_mod._harness_batch(h, hq, hk, d, PAGE, K, [CTX] * b, qlens=qlens, seed=hq + b)
    m.triton_turboquant_decode_attention = sndr_decode if patched else vllm_decode
    build = m.TurboQuantMetadataBuilder.build if patched else h.unpatched.build
    forward = m.TurboQuantAttentionImpl.forward if patched else h.unpatched.forward
    md = build(x.builder, 0, x.cam)
    out = torch.empty((x.n, hq * d), dtype=torch.bfloat16, device="cuda")

    def fwd():
        forward(x.impl, x.layer, x.q, x.kv, x.kv, x.cache, md, output=out)

    fwd()
    torch.cuda.synchronize()
    routed = bool(getattr(md, "sndr_verify_len", 0))
    graphed = kind == "decode" or routed
    if graphed:
        us = _tq_gpu.graph_time(fwd)
    else:
        us = triton.testing.do_bench(fwd, warmup=3, rep=200, return_mode="median") * 1e3
    bus = _host_us(lambda: build(x.builder, 0, x.cam))
    ref = out.clone()
    return {"hq": hq, "hk": hk, "d": d, "b": b, "kind": kind, "patched": patched, "graph": graphed,
            "routed_as_decode": routed, "forward_us": us, "build_us": bus, "out": ref}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="B = 32 only")
    ap.add_argument("--bs", default="1,2,8,32", help="batch sizes (requests)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    gen = harness_mod.harness_session()
    h = next(gen)
    try:
        from sndr.kernels.turboquant_k8v4 import canary, vllm_entry

        ws = Workspace()
        h.m.is_workspace_manager_initialized = lambda: True
        h.m.current_workspace_manager = lambda: ws
        vllm_decode = h.m.triton_turboquant_decode_attention
        bw = _tq_gpu.copy_bandwidth()
        rows = []
        print(f"device: {_tq_gpu.device_line()}; copy bandwidth {bw:.0f} GB/s")
        print("| model shape | B | batch | vLLM 0.32.0 us | sndr us | speed-up | build us vLLM / sndr | rel diff | "
              "sndr, route before round 11 us |")
        print("|---|---|---|---|---|---|---|---|---|")
        from sndr.kernels.turboquant_k8v4 import mtp_verify, verify_wg
        from sndr.kernels.turboquant_k8v4._layout import Layout

        for name, (hq, hk, d, layers, _note) in MODELS.items():
            for b in ((32,) if args.quick else tuple(int(x) for x in args.bs.split(","))):
                for kind in ("decode", "verify"):
                    up = measure(h, hq, hk, d, b, kind, False, vllm_decode, vllm_entry.decode)
                    ours = measure(h, hq, hk, d, b, kind, True, vllm_decode, vllm_entry.decode)
                    # where round 11's small-batch route changes the kernel, the same cell with the route before it
                    old = None
                    sp = hk * Layout(d).slot_size_aligned
                    shape = (mtp_verify.DEFAULT, hq, hk, d, K + 1, sp, 16)  # (its per-warp kernel: larger batches)
                    if kind == "verify" and verify_wg.uses(*shape, b) and verify_wg.kernels(*shape)[1]:
                        old = measure(h, hq, hk, d, b, kind, True, vllm_decode, vllm_entry.decode, small_batch=())
                        old.pop("out")
                    a, o = up.pop("out").double(), ours.pop("out").double()
                    rel = float((a - o).norm() / a.norm())
                    row = {"model": name, "layers": layers, "b": b, "kind": kind, "vllm": up, "sndr": ours,
                           "rel_diff": rel, "speedup": up["forward_us"] / ours["forward_us"], "sndr_route10": old}
                    rows.append(row)
                    how = lambda r: "graph" if r["graph"] else "eager"  # noqa: E731
                    print(f"| {name} {hq}/{hk} d{d} | {b} | {kind}{'' if kind == 'decode' else f' K={K}'} | "
                          f"{up['forward_us']:.1f} ({how(up)}) | {ours['forward_us']:.1f} ({how(ours)}) | "
                          f"{row['speedup']:.1f}x | {up['build_us']:.0f} / {ours['build_us']:.0f} | "
                          f"{rel:.1e} | " + (f"{old['forward_us']:.1f} ({how(old)}; now "
                                             f"{ours['forward_us'] / old['forward_us']:.2f}x)" if old else "=") + " |")
        print("\nper decode step, attention layers only (layers x forward):")
        proj = []
        for name, (_hq, _hk, _d, layers, note) in MODELS.items():
            for kind in ("decode", "verify"):
                r = next((r for r in rows if r["model"] == name and r["b"] == 32 and r["kind"] == kind), None)
                if r is None:
                    continue
                p = {"model": name, "note": note, "kind": kind, "layers": layers,
                     "vllm_ms": layers * r["vllm"]["forward_us"] / 1e3, "sndr_ms": layers * r["sndr"]["forward_us"] / 1e3}
                proj.append(p)
                print(f"  {note}, B=32, {CTX // 1024}K, {kind}{'' if kind == 'decode' else f' K={K}'}: "
                      f"vLLM {p['vllm_ms']:.2f} ms -> sndr {p['sndr_ms']:.2f} ms ({p['vllm_ms'] / p['sndr_ms']:.1f}x)")
        verdicts = canary._canary.results()
        print("canaries:", [(v["plugin"], v["status"], v["config"]) for v in verdicts])
        if args.json:
            args.json.write_text(json.dumps({"device": _tq_gpu.device_line(), "copy_gbs": bw, "rows": rows,
                                             "projection": proj, "canaries": verdicts, "argv": sys.argv},
                                            indent=1, default=str))
    finally:
        gen.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
