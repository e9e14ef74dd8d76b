"""TurboQuant k8v4 decode on one GPU: sndr's kernel vs vLLM 0.32.0's vs SDPA flash.

    python benchmarks/bench_tq_decode.py --check --table [--tune] [--out DIR]

* ``--check``: on the GPU, sndr's store writes the same bytes as vLLM's store
  (arbitrary bf16 keys, saturation included); sndr's and vLLM's decode agree
  with a float64 reference; a captured CUDA graph of the vLLM-signature entry
  replays correctly with new sequence lengths.
* ``--tune``: sweeps block size / warps / stages / split policy on a few cells.
* ``--sweep all [--adopt-best]``: times the kernel variants of ``VARIANTS`` under
  the shipped register-cap rule on the B >= 8, ctx >= 8K cells; ``--adopt-best``
  then runs the rest (``--check``, ``--table``) with the fastest as the default.
* ``--table``: every cell of B x context x Hq/Hk, head_dim 128, page 16:
  time eagerly and under CUDA-graph replay, host time per eager call (CPU
  timer around the call: Python + launches, no synchronisation), GB/s of cache
  bytes read, and % of the device-to-device copy bandwidth measured in the
  same run. ``--before DIR`` adds the same columns for another copy of the
  package (e.g. the previous commit's ``sndr/kernels/turboquant_k8v4``).
* ``--merge-probe [--adopt-merge]``: eager and graph time of each merge mode
  (``cuda_decode.MERGE_POLICY``: CUDA merge, PDL merge, merge folded into the
  split kernel, Triton merge for graphs) on ``--probe-cells``; ``--adopt-merge``
  then runs the rest with the modes that win without slowing any probed cell.

vLLM's kernels come from the 0.32.0 source files copied into
``.baselines/vllm032_tq`` (never committed; carried to the GPU host). Timing:
``triton.testing.do_bench`` medians, which flush L2 before each call, so every
call reads its cache from HBM as a decode step does.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

if "--cpu-smoke" in sys.argv:  # tiny shapes through Triton's interpreter, to test this script
    os.environ["TRITON_INTERPRET"] = "1"
DEV = "cpu" if "--cpu-smoke" in sys.argv else "cuda"

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import triton  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import _tq_gpu  # noqa: E402

from sndr.kernels.turboquant_k8v4 import (  # noqa: E402
    _vllm_baseline,
    cache_store,
    cuda_decode,
    dispatch,
    kernels,
    reference,
    vllm_entry,
)
from sndr.kernels.turboquant_k8v4._layout import Layout  # noqa: E402

D = 128
PAGE = 16
HK = 8
SLOT = Layout(D).slot_size_aligned
VLLM_SPLITS = 32  # vLLM's default attention_config.tq_max_kv_splits_for_cuda_graph

OUT = Path(os.environ.get("OUT", ROOT / ".bench"))


def sync():
    if DEV == "cuda":
        torch.cuda.synchronize()


def log(*a):
    print(*a, flush=True)


def bench(fn, graph: bool, rep: int = 200, clean: bool = False) -> float:
    """Median microseconds per call; L2 flushed before each call (``clean``: by a read,
    _tq_gpu.clean_cold_us, else by do_bench's 256 MB write)."""
    if DEV == "cpu":
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e6
    if graph:
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(2):
                fn()
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fn()
        torch.cuda.synchronize()
        run = g.replay
    else:
        run = fn
    if clean:
        return _tq_gpu.clean_cold_us(run)
    ms = triton.testing.do_bench(run, warmup=25, rep=rep, return_mode="median")
    return ms * 1e3


def copy_bandwidth() -> float:
    if DEV == "cpu":
        return 10.0
    return _tq_gpu.copy_bandwidth(rep=300)  # GB/s, bytes read + written


# ----------------------------------------------------------------------------- problem setup


class Cell:
    def __init__(self, b: int, ctx: int, hq: int, seed: int = 0, sdpa: bool = True):
        self.b, self.ctx, self.hq = b, ctx, hq
        g = torch.Generator(device=DEV).manual_seed(seed)
        dev = DEV
        pages = ctx // PAGE
        nb = b * pages
        self.kv_cache = torch.empty(nb, PAGE, HK, SLOT, dtype=torch.uint8, device=dev)
        perm = torch.randperm(nb, generator=g, device=dev).to(torch.int32)
        self.block_table = perm.reshape(b, pages).contiguous()
        self.seq_lens = torch.full((b,), ctx, dtype=torch.int32, device=dev)
        self.query = torch.randn(b, hq, D, generator=g, device=dev).to(torch.bfloat16)
        self.scale = D**-0.5
        if sdpa:
            self.k = torch.randn(b, HK, ctx, D, generator=g, device=dev).to(torch.bfloat16)
            self.v = torch.randn(b, HK, ctx, D, generator=g, device=dev).to(torch.bfloat16)
        # fill the paged cache through sndr's store (same data as the bf16 KV when kept)
        pos = torch.arange(ctx, device=dev)
        for i in range(b):
            if sdpa:
                k, v = self.k[i].transpose(0, 1), self.v[i].transpose(0, 1)
            else:
                k = torch.randn(ctx, HK, D, generator=g, device=dev).to(torch.bfloat16)
                v = torch.randn(ctx, HK, D, generator=g, device=dev).to(torch.bfloat16)
            slots = (self.block_table[i, pos // PAGE].long() * PAGE + pos % PAGE).to(torch.int32)
            cache_store.store(k.contiguous(), v.contiguous(), self.kv_cache, slots)
        # vLLM-style preallocated workspace (WorkspaceManager shapes)
        self.mid = torch.empty(b, hq, VLLM_SPLITS, D + 1, dtype=torch.float32, device=dev)
        self.out = torch.empty(b, hq, D, dtype=torch.bfloat16, device=dev)
        self.lse = torch.empty(b, hq, dtype=torch.float32, device=dev)
        self.eye = torch.eye(D, device=dev)
        self.centroids = torch.zeros(16, device=dev)
        if sdpa:
            self.q4 = self.query.view(b, HK, hq // HK, D)  # GQA as G query rows per KV head
        sync()

    @property
    def tq_bytes(self) -> int:
        return self.b * HK * self.ctx * SLOT

    @property
    def bf16_bytes(self) -> int:
        return self.b * HK * self.ctx * D * 2 * 2

    def ours(self):
        return vllm_entry.decode(
            self.query, self.kv_cache, self.block_table, self.seq_lens, self.eye, self.centroids,
            self.scale, 0, D, 4, key_fp8=True, mid_o_buf=self.mid, output_buf=self.out,
            lse_buf=self.lse, max_num_kv_splits=VLLM_SPLITS,
        )

    def ours_before(self):
        return BEFORE[0].decode(
            self.query, self.kv_cache, self.block_table, self.seq_lens, self.eye, self.centroids,
            self.scale, 0, D, 4, key_fp8=True, mid_o_buf=self.mid, output_buf=self.out,
            lse_buf=self.lse, max_num_kv_splits=VLLM_SPLITS,
        )

    def ours_cfg(self, cfg, max_splits):
        return dispatch.decode_attention(
            self.query, self.kv_cache, self.block_table, self.seq_lens, self.scale,
            out=self.out, config=cfg, max_splits=max_splits, workspace=self.ws,
        )

    def vllm(self, vl):
        return vl.decode(
            self.query, self.kv_cache, self.block_table, self.seq_lens, self.eye, self.centroids,
            self.scale, 0, D, 4, key_fp8=True, mid_o_buf=self.mid, output_buf=self.out,
            lse_buf=self.lse, max_num_kv_splits=VLLM_SPLITS,
        )

    def sdpa(self):
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return F.scaled_dot_product_attention(self.q4, self.k, self.v, scale=self.scale)


# ----------------------------------------------------------------------------- check


def torch_reference(cell_cache, block_table, seq_lens, query, scale):
    """float64 dequantize-then-attend on the GPU (vectorised reference.decode)."""
    b, hq, d = query.shape
    hk = cell_cache.shape[2]
    out = torch.zeros(b, hq, d, dtype=torch.float64, device=query.device)
    for i in range(b):
        n = int(seq_lens[i])
        pos = torch.arange(n, device=query.device)
        slots = cell_cache[block_table[i, pos // PAGE].long(), pos % PAGE]  # [n, hk, slot]
        k, v = reference.unpack(slots, d)
        k = k.double().transpose(0, 1).repeat_interleave(hq // hk, 0)
        v = v.double().transpose(0, 1).repeat_interleave(hq // hk, 0)
        s = torch.einsum("hd,hld->hl", query[i].double(), k) * scale
        out[i] = torch.einsum("hl,hld->hd", torch.softmax(s, -1), v)
    return out


def torch_reference_lse(cell_cache, block_table, seq_lens, query, scale):
    b, hq, d = query.shape
    hk = cell_cache.shape[2]
    out = torch.zeros(b, hq, dtype=torch.float64, device=query.device)
    for i in range(b):
        n = int(seq_lens[i])
        pos = torch.arange(n, device=query.device)
        slots = cell_cache[block_table[i, pos // PAGE].long(), pos % PAGE]
        k, _ = reference.unpack(slots, d)
        k = k.double().transpose(0, 1).repeat_interleave(hq // hk, 0)
        out[i] = torch.logsumexp(torch.einsum("hd,hld->hl", query[i].double(), k) * scale, -1)
    return out


def check(vl) -> dict:
    res = {}
    torch.manual_seed(0)
    # 1. store bytes vs vLLM's store, arbitrary bf16 keys incl. out-of-range and rounding ties
    n, nb = (4096, 512) if DEV == "cuda" else (32, 4)
    key = (torch.randn(n, HK, D, device=DEV) * 60).to(torch.bfloat16)
    key[0, 0, :3] = torch.tensor([1e4, -1e4, 1.9375])
    val = torch.randn(n, HK, D, device=DEV).to(torch.bfloat16)
    slots = torch.randperm(nb * PAGE, device=DEV)[:n].to(torch.int32)
    slots[::97] = -1
    a = torch.zeros(nb, PAGE, HK, SLOT, dtype=torch.uint8, device=DEV)
    b_ = a.clone()
    cache_store.store(key, val, a, slots)
    vl.store(key, val, b_, slots, torch.eye(D, device=DEV), torch.zeros(15, device=DEV),
             mse_bits=0, key_packed_size=D, value_quant_bits=4, key_fp8=True)
    sync()
    res["store_bytes_differ_vs_vllm"] = int((a != b_).sum())
    c = torch.zeros_like(a)
    reference.store(key.cpu(), val.cpu(), c, slots.cpu())
    res["store_bytes_differ_vs_torch_reference"] = int((a != c).sum())
    log("check store:", res)

    # 2. decode accuracy, both kernels, G = 4 and 8, mixed lengths incl. 0 and 1
    for hq in (32, 64):
        ctx = 2048 if DEV == "cuda" else 64
        cell = Cell(4, ctx, hq, seed=hq, sdpa=False)
        cell.seq_lens.copy_(torch.tensor([ctx, 1, ctx * 3 // 8, ctx - 5], dtype=torch.int32))
        ref = torch_reference(cell.kv_cache, cell.block_table, cell.seq_lens, cell.query, cell.scale)
        def triton_ours(cell=cell):
            with backend("triton"):
                return cell.ours()
        for name, fn in (("sndr", cell.ours), ("sndr_triton", triton_ours), ("vllm", lambda: cell.vllm(vl))):
            o = fn().double()
            sync()
            rel = ((o - ref).norm() / ref.norm()).item()
            res[f"decode_rel_err_{name}_hq{hq}"] = rel
        # the LSE the entry writes (natural log) vs float64
        cell.ours()
        sync()
        lse_ref = torch_reference_lse(cell.kv_cache, cell.block_table, cell.seq_lens, cell.query, cell.scale)
        res[f"lse_max_abs_err_hq{hq}"] = (cell.lse.double() - lse_ref).abs().max().item()
        # fp32 output straight from the kernels (no bf16 rounding)
        o32 = dispatch.decode_attention(cell.query, cell.kv_cache, cell.block_table, cell.seq_lens, cell.scale,
                                       out=torch.empty(4, hq, D, device=DEV)).double()
        res[f"decode_rel_err_sndr_fp32out_hq{hq}"] = ((o32 - ref).norm() / ref.norm()).item()
        # 3. CUDA graph: capture with one set of lengths, replay with another
        if DEV == "cpu":
            continue
        cell.seq_lens.fill_(1)
        g = torch.cuda.CUDAGraph()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            cell.ours()
        torch.cuda.current_stream().wait_stream(s)
        with torch.cuda.graph(g):
            gout = cell.ours()
        cell.seq_lens.copy_(torch.tensor([ctx - 49, 5, ctx, ctx // 3], dtype=torch.int32))
        g.replay()
        torch.cuda.synchronize()
        ref2 = torch_reference(cell.kv_cache, cell.block_table, cell.seq_lens, cell.query, cell.scale)
        res[f"graph_replay_rel_err_hq{hq}"] = ((gout.double() - ref2).norm() / ref2.norm()).item()
        cell = None  # frees its GPU buffers; closures above still name it, so no del
    # 4. other head sizes and group sizes through the default (GPU) path, pages 16 and 64
    worst = 0.0
    for d, g, page, qdt in ((64, 1, 16, torch.bfloat16), (64, 4, 64, torch.float16), (128, 6, 16, torch.bfloat16),
                            (128, 16, 32, torch.float16), (128, 8, 16, torch.float16), (128, 12, 16, torch.bfloat16),
                            (128, 2, 64, torch.bfloat16), (256, 4, 16, torch.bfloat16), (256, 8, 16, torch.bfloat16)):
        gen = torch.Generator(device=DEV).manual_seed(d + g)
        hk, b, nbp = 2, 3, 40
        nb = b * nbp
        lay = Layout(d)
        cache = torch.zeros(nb, page, hk, lay.slot_size_aligned, dtype=torch.uint8, device=DEV)
        n = nb * page
        cache_store.store(torch.randn(n, hk, d, generator=gen, device=DEV).to(torch.bfloat16) * 2,
                      torch.randn(n, hk, d, generator=gen, device=DEV).to(torch.bfloat16), cache,
                      torch.arange(n, device=DEV, dtype=torch.int32))
        bt = torch.randperm(nb, generator=gen, device=DEV).reshape(b, nbp).to(torch.int32)
        seq = torch.tensor([nbp * page, 1, 777 % (nbp * page)], dtype=torch.int32, device=DEV)
        q = torch.randn(b, hk * g, d, generator=gen, device=DEV).to(qdt)
        ref = torch.zeros(b, hk * g, d, dtype=torch.float64, device=DEV)
        for i in range(b):
            ln = int(seq[i])
            pos = torch.arange(ln, device=DEV)
            kk, vv = reference.unpack(cache[bt[i, pos // page].long(), pos % page], d)
            kk = kk.double().transpose(0, 1).repeat_interleave(g, 0)
            vv = vv.double().transpose(0, 1).repeat_interleave(g, 0)
            sc = torch.einsum("hd,hld->hl", q[i].double(), kk) * d**-0.5
            ref[i] = torch.einsum("hl,hld->hd", torch.softmax(sc, -1), vv)
        for bh_cfg in (None, kernels.DecodeConfig(maxnreg=168, occupancy=3, block_n=64 if d <= 128 else 32)):
            if DEV == "cuda" and bh_cfg is None:
                from sndr.kernels.turboquant_k8v4 import cuda_decode
                res[f"backend_d{d}_g{g}_page{page}"] = cuda_decode.unsupported(q, cache, bt, seq) or "cuda"
            o = dispatch.decode_attention(q, cache, bt, seq, d**-0.5, out=torch.empty(b, hk * g, d, device=DEV),
                                         config=bh_cfg)
            err = ((o.double() - ref).norm() / ref.norm()).item()
            res[f"decode_rel_err_d{d}_g{g}_page{page}_{'default' if bh_cfg is None else 'cap168'}"] = err
            worst = max(worst, err)
    res["decode_rel_err_other_shapes_worst"] = worst
    log("check:", json.dumps(res))
    return res


# ----------------------------------------------------------------------------- tune


KERNEL_SHAPES = (
    [dict(block_n=bn, num_warps=w, num_stages=st, words=wd, prefetch=False)
     for wd in (False, True) for bn in (64, 128) for w in (4, 8) for st in (1, 2)]
    + [dict(block_n=bn, num_warps=w, num_stages=1, words=True, prefetch=True) for bn in (32, 64, 128) for w in (4, 8)]
)
POLICIES = [dict(split_policy="ctas", ctas_per_sm=c, min_split_tokens=m) for c in (2, 4, 8, 16) for m in (256, 1024)]
# the last round: best shape of the sweep (int32 words + PTX unpack + prefetch, 64 tokens, 4 warps)
# against register caps (more programs per SM) and split policies
_BEST = dict(block_n=64, num_warps=4, num_stages=1, words=True, prefetch=True)
FINAL = (
    [dict(_BEST, maxnreg=r, occupancy=o, min_split_tokens=m)
     for (r, o) in ((None, 2), (168, 3), (128, 4)) for m in (128, 512)]
    + [dict(_BEST, split_policy="ctas", ctas_per_sm=4, min_split_tokens=1024)]
)


def accuracy(hq: int, cfg) -> float:
    """rel. error (fp32 output) vs float64 on mixed lengths; also catches wrong variants."""
    ctx = 1024 if DEV == "cuda" else 64
    cell = Cell(3, ctx, hq, seed=7, sdpa=False)
    cell.seq_lens.copy_(torch.tensor([ctx, 1, ctx // 3], dtype=torch.int32))
    ref = torch_reference(cell.kv_cache, cell.block_table, cell.seq_lens, cell.query, cell.scale)
    o = dispatch.decode_attention(cell.query, cell.kv_cache, cell.block_table, cell.seq_lens, cell.scale,
                                 out=torch.empty(3, hq, D, device=DEV), config=cfg, max_splits=VLLM_SPLITS)
    return ((o.double() - ref).norm() / ref.norm()).item()


def tune(cells, budget_s: float = 1e9, only_g=(), final: bool = False) -> dict:
    """Per G: every kernel shape (accuracy-gated) on the cells of that G, then the
    split policy for the best shape. Picks the lowest geometric-mean time.
    Returns {G: DecodeConfig}. Graph replay timing, shorter windows."""
    t_end = time.time() + budget_s
    picked = {}
    for hq in sorted({c[2] for c in cells}):
        g = hq // HK
        if only_g and g not in only_g:
            continue
        mine = [Cell(b, ctx, h, sdpa=False) for (b, ctx, h) in cells if h == hq]
        for c in mine:
            c.ws = torch.empty(c.b * hq * VLLM_SPLITS * (D + 1), dtype=torch.float32, device=DEV)

        def score(cfg):
            ts = []
            for c in mine:
                if time.time() > t_end:
                    return None
                try:
                    t = bench(lambda: c.ours_cfg(cfg, VLLM_SPLITS), graph=True, rep=60)
                except Exception as e:  # noqa: BLE001 (out of registers / shared memory)
                    log("tune fail", g, cfg, type(e).__name__, str(e)[:100])
                    return None
                ts.append(t)
                append_jsonl("tune.jsonl", dict(g=g, b=c.b, ctx=c.ctx, us=t, gbs=c.tq_bytes / (t * 1e-6) / 1e9,
                                                cfg=cfg.__dict__))
            return math.exp(sum(math.log(t) for t in ts) / len(ts)), ts

        results = []
        for ks in (FINAL if final else KERNEL_SHAPES):
            cfg = kernels.DecodeConfig(**ks) if final else kernels.DecodeConfig(
                **ks, split_policy="ctas", ctas_per_sm=8, min_split_tokens=256)
            try:
                err = accuracy(hq, cfg)
            except Exception as e:  # noqa: BLE001
                log("tune compile/run fail", g, ks, type(e).__name__, str(e)[:160])
                continue
            if not err < 2e-3:
                log("tune REJECT (accuracy)", g, ks, err)
                continue
            r = score(cfg)
            if r is None:
                continue
            results.append((r[0], cfg, r[1], err))
            log(f"tune G={g} {ks} geo {r[0]:.1f}us {[f'{t:.1f}' for t in r[1]]} err {err:.1e}")
        if not results:
            continue
        best = min(results, key=lambda x: x[0])
        for pol in ([] if final else POLICIES):
            cfg = kernels.DecodeConfig(**{**best[1].__dict__, **pol})
            r = score(cfg)
            if r is None:
                continue
            log(f"tune G={g} policy {pol} geo {r[0]:.1f}us {[f'{t:.1f}' for t in r[1]]}")
            if r[0] < best[0]:
                best = (r[0], cfg, r[1], best[3])
        log(f"tune PICK G={g}: {best[1]} geo {best[0]:.1f}us err {best[3]:.1e}")
        picked[g] = best[1]
        path = OUT / "tuned.json"
        saved = json.loads(path.read_text()) if path.exists() else {}
        saved[str(g)] = best[1].__dict__
        path.write_text(json.dumps(saved, indent=1))
        mine = None  # frees its GPU buffers; closures above still name it, so no del
        torch.cuda.empty_cache()
    return picked


# ----------------------------------------------------------------------------- sweep

# Kernel variants for --sweep, timed against each other in one run, each under the
# shipped rule (kernels.default_config): a 168-register cap when 64 <= B*Hk <= 256.
# "base": DecodeConfig fields; "occupancy" / "occupancy_capped": programs per SM
# uncapped / capped (the split count follows). Same form as kernels.SHIPPED's shapes.
VARIANTS = {
    "v1-shipped": {"base": dict(opaque=False, lazy=False), "occupancy": 2, "occupancy_capped": 3},
    "lazy-64": {"base": dict(), "occupancy": 2, "occupancy_capped": 3},
    "lazy-64-st2": {"base": dict(prefetch=False, num_stages=2), "occupancy": 2, "occupancy_capped": 3},
    "lazy-32": {"base": dict(block_n=32), "occupancy": 3, "occupancy_capped": 3},
    "lazy-32-st3": {"base": dict(block_n=32, prefetch=False, num_stages=3), "occupancy": 3, "occupancy_capped": 3},
    "lazy-1w16": {"base": dict(block_n=16, num_warps=1), "occupancy": 8, "occupancy_capped": 12},
    "lazy-1w32": {"base": dict(block_n=32, num_warps=1), "occupancy": 8, "occupancy_capped": 12},
    "lazy-2w32": {"base": dict(block_n=32, num_warps=2), "occupancy": 4, "occupancy_capped": 6},
    "lazy-2w32-st2": {"base": dict(block_n=32, num_warps=2, prefetch=False, num_stages=2),
                      "occupancy": 4, "occupancy_capped": 6},
}


def variant_config(v: dict, bh: int):
    """The DecodeConfig kernels.default_config would give for B*Hk = bh under SHIPPED = v."""
    if 64 <= bh <= 256:
        return kernels.DecodeConfig(**{**v["base"], "maxnreg": 168, "occupancy": v["occupancy_capped"]})
    return kernels.DecodeConfig(**{**v["base"], "occupancy": v["occupancy"]})


def cell_times(cells, times) -> dict:
    """{"cells": {"BxCK": us}, "pct": {"BxCK": % of the measured copy bandwidth}} of a sweep row."""
    key = lambda c: f"{c.b}x{c.ctx // 1024}K"  # noqa: E731
    return {"cells": {key(c): round(t, 1) for c, t in zip(cells, times)},
            "pct": {key(c): round(100 * c.tq_bytes / (t * 1e-6) / 1e9 / BW[0], 1) for c, t in zip(cells, times)}}


def fmt_cells(r) -> str:
    return " ".join(f"{k}:{v}us/{r['pct'][k]}%" for k, v in r["cells"].items())


def append_jsonl(name: str, r: dict) -> None:
    with open(OUT / name, "a") as f:
        f.write(json.dumps(r) + "\n")


def sweep(cells, names) -> list:
    """Graph-replay time of each variant on each cell (accuracy-gated); JSON lines in sweep.jsonl."""
    rows = []
    for hq in sorted({c[2] for c in cells}):
        g = hq // HK
        mine = [Cell(b, ctx, h, sdpa=False) for (b, ctx, h) in cells if h == hq]
        for c in mine:
            c.ws = torch.empty(c.b * hq * VLLM_SPLITS * (D + 1), dtype=torch.float32, device=DEV)
        for name in names:
            v = VARIANTS[name]
            try:
                err = max(accuracy(hq, variant_config(v, bh)) for bh in (3 * HK, 64))
                ts = [bench(lambda: c.ours_cfg(variant_config(v, c.b * HK), VLLM_SPLITS), graph=True, rep=60)
                      for c in mine]
            except Exception as e:  # noqa: BLE001
                log(f"sweep FAIL G={g} {name}: {type(e).__name__} {str(e)[:200]}")
                continue
            if not err < 2e-3:
                log(f"sweep REJECT G={g} {name}: rel. error {err:.2e}")
                continue
            geo = math.exp(sum(math.log(t) for t in ts) / len(ts))
            r = dict(g=g, name=name, err=err, geo_us=geo, **cell_times(mine, ts))
            rows.append(r)
            log(f"sweep G={g} {name:14s} geo {geo:8.1f}us err {err:.1e} {fmt_cells(r)}")
            append_jsonl("sweep.jsonl", r)
        del mine
        torch.cuda.empty_cache()
    return rows


def adopt_best(rows) -> str | None:
    """Install the variant with the lowest geometric mean over every swept cell as kernels.SHIPPED."""
    per = {}
    for r in rows:
        per.setdefault(r["name"], []).extend(r["cells"].values())
    n = max((len(t) for t in per.values()), default=0)
    full = {k: math.exp(sum(math.log(x) for x in t) / len(t)) for k, t in per.items() if len(t) == n}
    if not full:
        return None
    best = min(full, key=full.get)
    kernels.SHIPPED = [(None, VARIANTS[best])]
    log("sweep geo-means: " + ", ".join(f"{k} {v:.1f}us" for k, v in sorted(full.items(), key=lambda x: x[1])))
    log(f"ADOPTED {best}: kernels.SHIPPED = {VARIANTS[best]}")
    info = {"adopted": best, "shipped": VARIANTS[best], "geo_us": full}
    (OUT / "adopted.json").write_text(json.dumps(info, indent=1))
    return best


BW = [1.0]


class backend:
    """Run the block under SNDR_TQ_BACKEND=name (auto: CUDA where supported, else Triton)."""

    def __init__(self, name: str):
        self.name = name

    def __enter__(self):
        self.old = os.environ.get("SNDR_TQ_BACKEND")
        os.environ["SNDR_TQ_BACKEND"] = self.name

    def __exit__(self, *exc):
        if self.old is None:
            os.environ.pop("SNDR_TQ_BACKEND", None)
        else:
            os.environ["SNDR_TQ_BACKEND"] = self.old


def cuda_probe(hq: int = 32, b: int = 8, ctxs=(512, 1024, 2048, 4096, 8192, 16384, 32768)) -> None:
    """Where the fixed cost goes: full call, split kernel alone, merge alone, vs context."""
    from sndr.kernels.turboquant_k8v4 import cuda_decode

    pts = []
    for ctx in ctxs:
        c = Cell(b, ctx, hq, sdpa=False)
        cfg = cuda_decode.resolve(cuda_decode.DEFAULT, c.kv_cache)
        k, wps = cuda_decode.kernel_for(c.query, c.kv_cache, cfg)
        splits = cuda_decode.num_splits(b * HK, wps, torch.cuda.get_device_properties(0).multi_processor_count,
                                        min(cuda_decode.MAX_SPLITS, max(VLLM_SPLITS, cfg.max_splits)), cfg.waves)
        mt = max(1, math.ceil(cfg.min_split_tokens / 16))
        mid_o = torch.empty(b * hq * splits * D, device=DEV)
        mid_l = torch.empty(b * hq * splits, device=DEV)
        full = bench(c.ours, graph=True, rep=60)
        split = bench(lambda: cuda_decode.launch_split(k, cfg, c.query, c.kv_cache, c.block_table, c.seq_lens,
                                                       mid_o, mid_l, c.scale, splits, mt), graph=True, rep=60)
        merge = bench(lambda: cuda_decode.launch_merge(c.query, c.seq_lens, mid_o, mid_l, c.out, c.lse, splits, mt, k,
                                                       cuda=True), graph=True, rep=60)
        merge_tri = bench(lambda: cuda_decode.launch_merge(c.query, c.seq_lens, mid_o, mid_l, c.out, c.lse, splits, mt,
                                                           cuda=False), graph=True, rep=60)
        with backend("triton"):
            tri = bench(c.ours, graph=True, rep=60)
        pts.append((c.tq_bytes, split))
        log(f"cuda-probe hq={hq} B={b} ctx={ctx} splits={splits} MB={c.tq_bytes / 1e6:.1f} full {full:.1f}us "
            f"split {split:.1f}us merge {merge:.1f}us (Triton merge {merge_tri:.1f}us) triton {tri:.1f}us split-BW {c.tq_bytes / split / 1e3:.0f}GB/s")
        c = None  # frees its GPU buffers; closures above still name it, so no del
    n = len(pts)
    mx = sum(p[0] for p in pts) / n
    my = sum(p[1] for p in pts) / n
    slope = sum((p[0] - mx) * (p[1] - my) for p in pts) / sum((p[0] - mx) ** 2 for p in pts)
    log(f"cuda-probe fit split: fixed {my - slope * mx:.1f}us + bytes at {1e-3 / slope:.0f} GB/s")


def parse_cuda_cfg(name: str):
    """'ps3w8b2' (page kernel) / 's3w4b4' (warp kernel) [+ 'v<waves>'] [+ 'm<max splits>'] [+ 't<min split tokens>']
    [+ 'c<cluster size>': page kernel merging through clusters of splits] [+ 'e': L2 evict-first cache reads]
    [+ 'g': merge in the page kernel's own cooperative grid]
    -> (CudaConfig, max_splits)."""
    import re

    from sndr.kernels.turboquant_k8v4 import cuda_decode

    m = re.fullmatch(r"(p|)s(\d+)w(\d+)b(\d+)(?:v(\d+))?(?:m(\d+))?(?:t(\d+))?(?:c(\d+))?(e?)(g?)", name)
    if not m:
        raise SystemExit(f"bad --cuda-sweep entry {name!r} (e.g. s3w4b4, page kernel: ps3w8b2, ps3w8b2m64t64)")
    kind, st, w, b, v, ms, mt, cl, ev, gm = m.groups()
    d = cuda_decode.CudaConfig()
    cfg = cuda_decode.CudaConfig(kind="page" if kind else "warp", stages=int(st), warps=int(w),
                                 min_blocks=int(b), waves=int(v or d.waves),
                                 min_split_tokens=int(mt or d.min_split_tokens), max_splits=int(ms or d.max_splits),
                                 cluster=int(cl or 0), evict_first=bool(ev), grid_merge=bool(gm))
    return cfg, VLLM_SPLITS


def cuda_sweep(cells, names) -> list:
    """Graph-replay time of CUDA kernel configs vs the Triton default, accuracy-gated."""
    from sndr.kernels.turboquant_k8v4 import cuda_decode

    rows = []
    floor = torch.zeros(64, device=DEV)
    log(f"cuda-sweep floor: a graph of one tiny kernel {bench(floor.zero_, graph=True, rep=60):.1f}us "
        f"(read-flushed L2: {bench(floor.zero_, graph=True, clean=True):.1f}us)")
    for hq in sorted({c[2] for c in cells}):
        mine = [Cell(b, ctx, h, sdpa=False) for (b, ctx, h) in cells if h == hq]
        for c in mine:
            c.ws = torch.empty(c.b * hq * VLLM_SPLITS * (D + 1), dtype=torch.float32, device=DEV)
        c0 = mine[0]  # how much of a cell's time the flush method decides: a plain read of its cache
        rd = lambda: torch.amax(c0.kv_cache.view(torch.int32))  # noqa: E731
        log(f"cuda-sweep hq={hq} read-only probe B={c0.b} ctx={c0.ctx}: amax over the cache "
            f"({c0.tq_bytes / 1e6:.1f} MB) {bench(rd, graph=True, rep=60):.1f}us after do_bench's write flush, "
            f"{bench(rd, graph=True, clean=True):.1f}us after a read flush")
        runs = [("triton", (None, VLLM_SPLITS))] + [(n, parse_cuda_cfg(n)) for n in names]
        gate = Cell(4, 2048, hq, seed=7, sdpa=False)  # mixed lengths, partial tiles
        gate.seq_lens.copy_(torch.tensor([2048, 1, 771, 2037], dtype=torch.int32))
        gate.ws = torch.empty(4 * hq * VLLM_SPLITS * (D + 1), dtype=torch.float32, device=DEV)
        gate_ref = torch_reference(gate.kv_cache, gate.block_table, gate.seq_lens, gate.query, gate.scale)
        for name, (cfg, max_splits) in runs:
            def call(c, cfg=cfg, max_splits=max_splits):
                if cfg is None:
                    with backend("triton"):
                        return c.ours()
                return cuda_decode.decode_attention(
                    c.query, c.kv_cache, c.block_table, c.seq_lens, c.scale, out=c.out, lse=None,
                    workspace=c.ws, max_splits=max_splits, config=cfg)
            try:
                o = call(gate).double()
                sync()
                err = ((o - gate_ref).norm() / gate_ref.norm()).item()
                if not err < 4e-3:
                    log(f"cuda-sweep REJECT hq={hq} {name}: rel. error {err:.2e}")
                    continue
                ts = [bench(lambda c=c: call(c), graph=True, rep=60) for c in mine]
                ts_clean = [bench(lambda c=c: call(c), graph=True, clean=True) for c in mine]
                info = f" err {err:.1e}"
                if cfg is not None:
                    k, wps = cuda_decode.kernel_for(mine[0].query, mine[0].kv_cache, cfg)
                    info += f" regs {k.registers} spill {k.spill_bytes} warps/SM {wps}"
                    lp = cuda_decode.launch_plan(mine[0].query, mine[0].kv_cache, mine[0].block_table, mine[0].out,
                                                 None, max_splits, cfg)
                    info += f" splits {lp.splits} mode {lp.mode(True)}"
            except Exception as e:  # noqa: BLE001
                log(f"cuda-sweep FAIL hq={hq} {name}: {type(e).__name__} {str(e)[:300]}")
                continue
            r = dict(hq=hq, name=name, **cell_times(mine, ts))
            r["clean"] = cell_times(mine, ts_clean)
            rows.append(r)
            log(f"cuda-sweep hq={hq} {name:10s}{info} {fmt_cells(r)} | read-flushed L2: {fmt_cells(r['clean'])}")
            append_jsonl("cuda_sweep.jsonl", r)
        del mine
        torch.cuda.empty_cache()
    return rows


# ----------------------------------------------------------------------------- host time, before, merge probe

BEFORE: list = []


def load_before(path: str):
    """Import another copy of the turboquant_k8v4 package (e.g. the previous commit's) as
    ``sndr.kernels.tq_before``; its ``vllm_entry`` times the "before" columns."""
    import importlib.util

    init = Path(path) / "__init__.py"
    spec = importlib.util.spec_from_file_location("sndr.kernels.tq_before", init,
                                                  submodule_search_locations=[str(Path(path))])
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    import importlib as il

    BEFORE.append(il.import_module("sndr.kernels.tq_before.vllm_entry"))
    return BEFORE[0]


def host_us(fn, n: int = 300, every: int = 10) -> float:
    """Median CPU microseconds of one eager call (launch only: the GPU is synchronised
    between batches of ``every`` calls, outside the timed region)."""
    if DEV == "cpu":
        return 0.0
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    ts = []
    for i in range(n):
        if i % every == 0:
            torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    torch.cuda.synchronize()
    ts.sort()
    return ts[len(ts) // 2] * 1e6


GRAPH_MODES = ("triton", "cuda", "pdl", "fold", "rows", "rows_pdl")
EAGER_MODES = ("cuda", "pdl", "fold", "rows", "rows_pdl")


def set_merge(eager: str, graph: str) -> None:
    cuda_decode.MERGE_POLICY.update(eager=eager, graph=graph)
    dispatch.reset()


def merge_probe(cells, adopt: bool) -> dict:
    """Graph and eager time of each merge mode per cell; with ``adopt``, install the modes
    with the lowest geometric mean whose every cell is within 2% of the baseline
    (graph: Triton merge, eager: CUDA merge) or faster."""
    shipped = dict(cuda_decode.MERGE_POLICY)
    res = {"graph": {m: {} for m in GRAPH_MODES}, "eager": {m: {} for m in EAGER_MODES}}
    for (b, ctx, hq) in cells:
        c = Cell(b, ctx, hq, sdpa=False)
        name = f"{hq}/{HK} B={b} {ctx // 1024}K"
        ref = None
        for m in GRAPH_MODES:
            set_merge("cuda", m)
            res["graph"][m][name] = bench(c.ours, graph=True, rep=80)
            o = c.out.float().clone()
            ref = o if ref is None else ref
            err = ((o - ref).norm() / ref.norm()).item()
            if not err < 1e-2:
                log(f"merge-probe REJECT graph {m} {name}: differs from the Triton-merge output by {err:.2e}")
                res["graph"][m][name] = float("inf")
        for m in EAGER_MODES:
            set_merge(m, "triton")
            res["eager"][m][name] = bench(c.ours, graph=False, rep=80)
        log(f"merge-probe {name} MB={c.tq_bytes / 1e6:.1f} graph " +
            " ".join(f"{m}:{res['graph'][m][name]:.1f}us/{100 * c.tq_bytes / (res['graph'][m][name] * 1e-6) / 1e9 / BW[0]:.0f}%"
                     for m in GRAPH_MODES) +
            " | eager " + " ".join(f"{m}:{res['eager'][m][name]:.1f}us" for m in EAGER_MODES))
        del c
        torch.cuda.empty_cache()
    pick = {}
    for kind, base in (("graph", "triton"), ("eager", "cuda")):
        ok = {m: t for m, t in res[kind].items() if all(t[k] <= 1.02 * res[kind][base][k] for k in t)}
        geo = {m: math.exp(sum(math.log(x) for x in t.values()) / len(t)) for m, t in ok.items()}
        pick[kind] = min(geo, key=geo.get) if geo else base
        log(f"merge-probe {kind}: geo-means " + ", ".join(f"{m} {g:.1f}us" for m, g in sorted(geo.items(), key=lambda x: x[1]))
            + f" -> {pick[kind]}")
    set_merge(shipped["eager"], shipped["graph"])
    if adopt:
        set_merge(pick["eager"], pick["graph"])
        log(f"ADOPTED merge policy {cuda_decode.MERGE_POLICY}")
    (OUT / "merge_probe.json").write_text(json.dumps({"results": res, "pick": pick}, indent=1))
    return {"results": res, "pick": pick}


# ----------------------------------------------------------------------------- table


def table(vl, bw: float, bs=(1, 8, 32, 64), ctxs=(1024, 8192, 32768), hqs=(32, 64)) -> list:
    rows = []
    for hq in hqs:
        for ctx in ctxs:
            for b in bs:
                cell = Cell(b, ctx, hq)
                r = dict(b=b, ctx=ctx, hq=hq, hk=HK, tq_bytes=cell.tq_bytes, bf16_bytes=cell.bf16_bytes)
                runs = [("sndr", cell.ours, cell.tq_bytes)]
                if BEFORE:
                    runs.append(("before", cell.ours_before, cell.tq_bytes))
                runs += [("vllm", lambda: cell.vllm(vl), cell.tq_bytes), ("sdpa", cell.sdpa, cell.bf16_bytes)]
                for name, fn, nbytes in runs:
                    for mode in ("eager", "graph"):
                        t = bench(fn, graph=(mode == "graph"), rep=REP[0])
                        r[f"{name}_{mode}_us"] = t
                        r[f"{name}_{mode}_gbs"] = nbytes / (t * 1e-6) / 1e9
                        r[f"{name}_{mode}_pct"] = 100 * r[f"{name}_{mode}_gbs"] / bw
                    if name != "sdpa":
                        r[f"{name}_host_us"] = host_us(fn)
                rows.append(r)
                log(fmt_row(r))
                append_jsonl("table.jsonl", r)
                cell = None  # frees its GPU buffers; closures above still name it, so no del
                torch.cuda.empty_cache()
    return rows


HEADER = ("| Hq/Hk | B | ctx | sndr graph us | GB/s | %BW | sndr eager us | sndr host us | before graph us "
          "| before eager us | before host us | vLLM graph us | vLLM eager us | vLLM host us | SDPA graph us "
          "| SDPA eager us | x vs vLLM | x vs SDPA | goals |")
NCOLS = 19
REP = [200]


def goals(r) -> str:
    out = []
    t = r["sndr_graph_us"]
    if r["b"] >= 8 and r["ctx"] >= 8192:
        out.append("BW>=70% ok" if r["sndr_graph_pct"] >= 70 else "BW>=70% MISS")
    if r["ctx"] >= 8192:
        out.append("<SDPA ok" if t < r["sdpa_graph_us"] else "<SDPA MISS")
    if r["b"] == 1:
        out.append("<=2xSDPA ok" if t <= 2 * r["sdpa_graph_us"] else "<=2xSDPA MISS")
    out.append("eager<=vLLM ok" if r["sndr_eager_us"] <= r["vllm_eager_us"] else "eager<=vLLM MISS")
    out.append("host<=15us ok" if r.get("sndr_host_us", 0) <= 15 else "host<=15us MISS")
    if "before_graph_us" in r:
        out.append("graph<=before+3% ok" if t <= 1.03 * r["before_graph_us"] else "graph<=before+3% MISS")
    return ", ".join(out) or "-"


def fmt_row(r) -> str:
    g = lambda k: f"{r[k]:.1f}" if k in r else "-"  # noqa: E731
    return (f"| {r['hq']}/{r['hk']} | {r['b']} | {r['ctx'] // 1024}K | {r['sndr_graph_us']:.1f} | {r['sndr_graph_gbs']:.0f} "
            f"| {r['sndr_graph_pct']:.0f}% | {r['sndr_eager_us']:.1f} | {g('sndr_host_us')} | {g('before_graph_us')} "
            f"| {g('before_eager_us')} | {g('before_host_us')} | {r['vllm_graph_us']:.1f} | {r['vllm_eager_us']:.1f} "
            f"| {g('vllm_host_us')} | {r['sdpa_graph_us']:.1f} | {r['sdpa_eager_us']:.1f} "
            f"| {r['vllm_graph_us'] / r['sndr_graph_us']:.1f} | {r['sdpa_graph_us'] / r['sndr_graph_us']:.2f} | {goals(r)} |")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--cpu-smoke", action="store_true", help="tiny shapes on the CPU interpreter (tests this script)")
    ap.add_argument("--tune", action="store_true")
    ap.add_argument("--sweep", default="", help="time these VARIANTS (comma list, or 'all') on --sweep-cells")
    ap.add_argument("--adopt-best", action="store_true", help="after --sweep, use the fastest variant for the rest")
    ap.add_argument("--sweep-cells", default="8:8192:32,32:8192:32,64:8192:32,8:32768:32,32:32768:32,64:32768:32,"
                    "8:8192:64,32:8192:64,64:8192:64,8:32768:64,32:32768:64,64:32768:64")
    ap.add_argument("--table", action="store_true")
    ap.add_argument("--rep", type=int, default=200, help="do_bench window per timing, ms (--table)")
    ap.add_argument("--before", default=None, help="another copy of sndr/kernels/turboquant_k8v4 to time as 'before'")
    ap.add_argument("--merge-probe", action="store_true", help="time the merge modes (cuda_decode.MERGE_POLICY)")
    ap.add_argument("--adopt-merge", action="store_true", help="after --merge-probe, run the rest with the winners")
    ap.add_argument("--probe-cells", default="8:8192:32,8:8192:64,1:32768:32,1:1024:32,32:8192:32,64:1024:64,8:32768:64")
    ap.add_argument("--cuda-probe", action="store_true", help="fixed cost vs context of the CUDA path")
    ap.add_argument("--cuda-sweep", default="", help="CUDA kernel configs to time, e.g. s3w4b4,s2w1b16")
    ap.add_argument("--cuda-cells", default="1:8192:32,1:32768:32,8:8192:32,32:8192:32,64:8192:32,8:32768:32,"
                    "32:32768:32,64:32768:32,8:8192:64,32:32768:64")
    ap.add_argument("--baseline", default=None, help="folder with vLLM 0.32.0's three TurboQuant source files")
    ap.add_argument("--vllm", default="0.32.0", metavar="X",
                    help="time vLLM X's kernels as the baseline (.baselines/vllm-X_tq, the tree cache, else "
                         "fetched); summary.json then names it: a `pin advance --perf-ref` for PK0001 on a bump to X")
    ap.add_argument("--bs", default="1,8,32,64")
    ap.add_argument("--ctxs", default="1024,8192,32768")
    ap.add_argument("--hqs", default="32,64")
    ap.add_argument("--tune-budget", type=float, default=300.0, help="seconds")
    ap.add_argument("--final", action="store_true", help="tune only the last round (FINAL)")
    ap.add_argument("--tune-g", default="", help="only these group sizes, e.g. 4 or 4,8")
    ap.add_argument("--use-tuned", default=None, help="tuned.json from --tune: configs for the table")
    ap.add_argument("--tune-cells", default="1:32768:32,8:8192:32,32:32768:32,64:1024:32,1:32768:64,8:8192:64,32:32768:64,64:1024:64")
    args = ap.parse_args(argv)
    OUT.mkdir(parents=True, exist_ok=True)

    src = Path(args.baseline) if args.baseline else _vllm_baseline.find_dir(ROOT, args.vllm, fetch=True)
    if src is None:
        log("vLLM 0.32.0 TurboQuant sources not found; copy them to .baselines/vllm032_tq")
        return 2
    vl = _vllm_baseline.load(src)
    if DEV == "cuda":
        props = torch.cuda.get_device_properties(0)
        device_line = (f"{props.name}, {props.multi_processor_count} SMs, {props.total_memory / 2**30:.0f} GiB, "
                       f"torch {torch.__version__}, triton {triton.__version__}, CUDA {torch.version.cuda}")
    else:
        from sndr.kernels.turboquant_k8v4 import _interp

        _interp.fix_scalar_index()
        device_line = f"CPU smoke test (Triton interpreter), torch {torch.__version__}, triton {triton.__version__}"
    log("device:", device_line)
    t0 = time.time()
    summary = {"plugin": "PK0001", "vllm": args.vllm, "baseline_dir": str(src), "device": device_line}
    bw = copy_bandwidth()
    summary["copy_bandwidth_gbs"] = bw
    log(f"copy bandwidth: {bw:.0f} GB/s (read + write)")
    BW[0] = bw
    if args.sweep:
        names = list(VARIANTS) if args.sweep == "all" else args.sweep.split(",")
        rows = sweep([tuple(int(x) for x in c.split(":")) for c in args.sweep_cells.split(",") if c], names)
        if args.adopt_best:
            summary["adopted"] = adopt_best(rows)
        log(f"[{time.time() - t0:.0f}s] sweep done")
    REP[0] = args.rep
    if args.before:
        load_before(args.before)
        log(f"before: {args.before}")
    if args.merge_probe:
        summary["merge_probe"] = merge_probe([tuple(int(x) for x in c.split(":")) for c in args.probe_cells.split(",") if c],
                                             args.adopt_merge)
        log(f"[{time.time() - t0:.0f}s] merge probe done")
    summary["merge_policy"] = dict(cuda_decode.MERGE_POLICY)
    if args.cuda_probe:
        cuda_probe()
        cuda_probe(b=32, ctxs=(1024, 4096, 8192))
        cuda_probe(b=1, ctxs=(8192, 32768))
        log(f"[{time.time() - t0:.0f}s] cuda probe done")
    if args.cuda_sweep:
        cuda_sweep([tuple(int(x) for x in c.split(":")) for c in args.cuda_cells.split(",") if c],
                   [n for n in args.cuda_sweep.split(",") if n])
        log(f"[{time.time() - t0:.0f}s] cuda sweep done")
    if args.check:
        summary["check"] = check(vl)
        log(f"[{time.time() - t0:.0f}s] check done")
    if args.tune:
        cells = [tuple(int(x) for x in c.split(":")) for c in args.tune_cells.split(",") if c]
        only = tuple(int(x) for x in args.tune_g.split(",") if x)
        picked = tune(cells, args.tune_budget, only, final=args.final)
        for g, cfg in picked.items():
            kernels.TUNED[(D, g)] = cfg  # the table's vLLM-signature entry then uses it
        summary["tuned"] = {g: cfg.__dict__ for g, cfg in picked.items()}
        log(f"[{time.time() - t0:.0f}s] tune done")
    if args.use_tuned and not Path(args.use_tuned).exists():
        log(f"no {args.use_tuned}: built-in defaults")
    elif args.use_tuned:
        for g, c in json.loads(Path(args.use_tuned).read_text()).items():
            kernels.TUNED[(D, int(g))] = kernels.DecodeConfig(**c)
            log(f"using tuned G={g}: {kernels.TUNED[(D, int(g))]}")
        summary["tuned"] = {g: c.__dict__ for (d_, g), c in kernels.TUNED.items()}
    if args.table:
        ints = lambda s: tuple(int(x) for x in s.split(",") if x)  # noqa: E731
        rows = table(vl, bw, ints(args.bs), ints(args.ctxs), ints(args.hqs))
        summary["rows"] = rows
        lines = [f"device: {device_line}", f"copy bandwidth: {bw:.0f} GB/s",
                 f"merge policy: {cuda_decode.MERGE_POLICY}", f"command: {' '.join(sys.argv)}", "", HEADER,
                 "|" + "---|" * NCOLS]
        lines += [fmt_row(r) for r in rows]
        (OUT / "table.md").write_text("\n".join(lines) + "\n")
        log("\n".join(lines))
        log(f"[{time.time() - t0:.0f}s] table done")
    if args.table or args.check:
        (OUT / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
