"""Speculative-verify attention on the TurboQuant k8v4 cache, one H200: sndr vs vLLM 0.32.0.

    python3 benchmarks/bench_mtp_verify.py [--quick] [--check] [--probe] [--out DIR]

A verify step scores K + 1 query tokens per request; token t sees seq_len - K + t
cached tokens. Every variant runs in this one process, on the same caches:

* (a) sndr: ``mtp_verify.verify_attention`` (the CUDA kernel of verify_k8v4.cu,
  what patch PK0002 runs), captured in a CUDA graph and replayed;
* (b) vLLM 0.32.0's path for the same batch: ``_prefill_attention``'s loop over
  requests, each a call of vLLM's ``triton_turboquant_decode_attention`` on K + 1
  synthetic single-token rows (lengths ``arange[cached+1 : seq_len+1]``, block
  table row expanded), host lists from CPU tensors, eager (it cannot be captured);
* (c) the same B (K + 1) synthetic rows in one call of PK0001's decode (the
  vLLM-signature entry ``vllm_entry.decode``, vLLM-shaped workspace), captured;
* (d) one plain decode step (K = 0) of PK0001, captured.

Cells: B in {1, 8, 32, 64}, K in {1, 3, 5, 7}, context 8K and 32K (every request at
the full context, the K + 1 new tokens included), Hq/Hk 32/8 and 64/8, head dim
128, page 16, block tables random permutations of pages. Times are medians of
``triton.testing.do_bench`` (L2 flushed before each call) for (a), (c), (d) and of
CUDA-event-timed eager calls for (b). GB/s = the cache bytes one step must read
(B x context x Hk x 196 B, the same for all four variants) / time; %BW against
the device-to-device copy bandwidth measured in the same run. (a0): the kernel before issue 27
(``chunk_warps=1, kchain=1, merge_rows=0, wgmma=0``: one warp per KV head, a block per 16-row chunk, one score
accumulator chain, the block-per-row merge), timed in the same run. (aw): the per-warp kernel everywhere
(``wgmma=0``: round 6's default), timed in the cells where the default runs the warpgroup-MMA kernel
(``verify_wgmma.cu``, 17..64 query rows per KV head; "=" elsewhere). ``--probe`` times the variants of
``PROBE`` (block plans, the shared-unpack CTA, the warpgroup-MMA kernel's shapes, ...) on the cells with more
than 16 rows per KV head.

vLLM's kernel files come from ``.baselines/vllm032_tq`` (copied from the 0.32.0
wheel, never committed). ``--check`` first compares (a), (c), (d) against a
float64 reference ("errors equal to (d)'s"). ``--probe`` times kernel variants
(block plans, per-warp or shared unpacking, unpacked tiles, heads and warps per block, the softmax
paths, ring depth; ``--variants`` picks them by name) on the B = 8 and 32 cells with more than 16
query rows per KV head before the table. ``--ncu-launch NAME`` runs one variant once (after a
warm-up call) at Hq 64, K 3, B 32, 8K and nothing else, for ``ncu --launch-skip 1``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path

import torch
import triton

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import _tq_gpu  # noqa: E402

from sndr.kernels.turboquant_k8v4 import _vllm_baseline, mtp_verify, reference, verify_wg, vllm_entry  # noqa: E402
from sndr.kernels.turboquant_k8v4._layout import Layout  # noqa: E402

D = 128
PAGE = 16
HK = 8
SLOT = Layout(D).slot_size_aligned
VLLM_SPLITS = 32  # vLLM's attention_config.tq_max_kv_splits_for_cuda_graph default
BS = (1, 8, 32, 64)
KS = (1, 3, 5, 7)
CTXS = (8192, 32768)
HQS = (32, 64)
LAYERS = 40


def log(*a):
    print(*a, flush=True)


def dobench(fn, rep=100) -> float:
    return triton.testing.do_bench(fn, warmup=25, rep=rep, return_mode="median") * 1e3


def graph_us(fn, rep=100) -> float:
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    torch.cuda.synchronize()
    t = dobench(g.replay, rep)
    del g
    return t


def eager_us(fn, n=5, warm=2) -> float:
    """Median of n eager calls, CUDA events around each (launch gaps included), L2 flushed before each."""
    flush = torch.empty(256 * 1024 * 1024, dtype=torch.uint8, device="cuda")
    for _ in range(warm):
        fn()
    ts = []
    for _ in range(n):
        flush.zero_()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) * 1e3)
    ts.sort()
    return ts[len(ts) // 2]


class Pool:
    """One cache for the largest batch and context; cells take the first B requests."""

    def __init__(self, bmax: int, ctx: int, seed: int = 0):
        gen = torch.Generator(device="cuda").manual_seed(seed)
        pages = ctx // PAGE
        nb = bmax * pages
        self.cache = _tq_gpu.synthetic_cache(nb, PAGE, HK, D, gen)
        self.bt = torch.randperm(nb, generator=gen, device="cuda").to(torch.int32).reshape(bmax, pages).contiguous()
        self.ctx = ctx


class Cell:
    def __init__(self, pool: Pool, b: int, k: int, hq: int, vl, seed: int = 1):
        gen = torch.Generator(device="cuda").manual_seed(seed)
        self.b, self.k, self.hq, self.ctx = b, k, hq, pool.ctx
        ql = k + 1
        self.cache = pool.cache
        self.bt = pool.bt[:b].contiguous()
        self.sl = torch.full((b,), pool.ctx, dtype=torch.int32, device="cuda")
        self.sl_cpu = self.sl.cpu()
        self.q = (torch.randn(b * ql, hq, D, generator=gen, device="cuda") * 0.5).to(torch.bfloat16)
        self.scale = D ** -0.5
        self.out = torch.empty_like(self.q)
        self.vl = vl
        # (b): vLLM's continuation loop state
        self.qsl_cpu = torch.arange(0, b * ql + 1, ql, dtype=torch.int32)
        self.arange = torch.arange(0, pool.ctx + 1, device="cuda", dtype=torch.int32)
        self.eye = torch.eye(D, device="cuda")
        self.centroids = torch.zeros(16, device="cuda")
        # (c): synthetic rows, vLLM-shaped workspace for the vLLM-signature entry
        self.syn_sl = mtp_verify.synthetic_lengths(self.sl, b, k)
        self.syn_bt = self.bt.repeat_interleave(ql, 0).contiguous()
        n = b * ql
        self.mid_c = torch.empty(n, hq, VLLM_SPLITS, D + 1, dtype=torch.float32, device="cuda")
        self.out_c = torch.empty(n, hq, D, dtype=torch.bfloat16, device="cuda")
        self.lse_c = torch.empty(n, hq, dtype=torch.float32, device="cuda")
        # (d): the plain decode step of the same batch
        self.q_d = self.q.view(b, ql, hq, D)[:, -1].contiguous()
        self.mid_d = torch.empty(b, hq, VLLM_SPLITS, D + 1, dtype=torch.float32, device="cuda")
        self.out_d = torch.empty(b, hq, D, dtype=torch.bfloat16, device="cuda")
        self.lse_d = torch.empty(b, hq, dtype=torch.float32, device="cuda")

    @property
    def bytes(self) -> int:
        return self.b * self.ctx * HK * SLOT

    def a(self):
        return mtp_verify.verify_attention(self.q, self.cache, self.bt, self.sl, self.scale, self.k, out=self.out)

    def b_vllm(self):
        """vLLM 0.32.0 _prefill_attention, continuation branch (q_len <= 128), for this batch."""
        ql = self.k + 1
        n = self.q.shape[0]
        output = torch.zeros(n, self.hq, D, device="cuda", dtype=self.q.dtype)
        qsl = self.qsl_cpu.tolist()
        seq_lens_list = self.sl_cpu.tolist()
        for i in range(self.b):
            q_start, q_end = qsl[i], qsl[i + 1]
            q_len = q_end - q_start
            seq_len = seq_lens_list[i]
            cached_len = seq_len - q_len
            synth_seq_lens = self.arange[cached_len + 1: seq_len + 1]
            synth_bt = self.bt[i: i + 1].expand(q_len, -1)
            out = self.vl.decode(
                query=self.q[q_start:q_end], kv_cache=self.cache, block_table=synth_bt, seq_lens=synth_seq_lens,
                Pi=self.eye, centroids=self.centroids, scale=self.scale, mse_bits=0, key_packed_size=D,
                value_quant_bits=4, key_fp8=True, norm_correction=False, PiT=self.eye)
            output[q_start:q_end] = out.to(self.q.dtype)
        assert ql == q_len
        return output

    def c(self):
        return vllm_entry.decode(
            self.q, self.cache, self.syn_bt, self.syn_sl, self.eye, self.centroids, self.scale, 0, D, 4,
            key_fp8=True, mid_o_buf=self.mid_c, output_buf=self.out_c, lse_buf=self.lse_c,
            max_num_kv_splits=VLLM_SPLITS)

    def d(self):
        return vllm_entry.decode(
            self.q_d, self.cache, self.bt, self.sl, self.eye, self.centroids, self.scale, 0, D, 4,
            key_fp8=True, mid_o_buf=self.mid_d, output_buf=self.out_d, lse_buf=self.lse_d,
            max_num_kv_splits=VLLM_SPLITS)


def rel(a, b):
    return ((a.double() - b).norm() / b.norm()).item()


def check(vl) -> list[dict]:
    """(a), (b), (c), (d) against float64 on real (stored) data; ragged lengths."""
    rows = []
    for hq, k in ((32, 3), (64, 3), (32, 1), (64, 5), (64, 7), (32, 7)):
        gen = torch.Generator(device="cuda").manual_seed(hq + k)
        lens = [8192, 5000, 777]
        ql = k + 1
        pages = -(-max(lens) // PAGE)
        nb = len(lens) * pages + 2
        cache = torch.full((nb, PAGE, HK, SLOT), 0xFF, dtype=torch.uint8, device="cuda")
        bt = torch.randperm(nb, generator=gen, device="cuda")[: len(lens) * pages].to(torch.int32).view(len(lens), pages)
        from sndr.kernels.turboquant_k8v4 import cache_store

        for i, n in enumerate(lens):
            pos = torch.arange(n, device="cuda")
            slots = (bt[i, pos // PAGE].long() * PAGE + pos % PAGE).to(torch.int32)
            cache_store.store((torch.randn(n, HK, D, generator=gen, device="cuda") * 1.5).bfloat16(),
                          (torch.randn(n, HK, D, generator=gen, device="cuda") * 0.5 + 0.2).bfloat16(), cache, slots)
        sl = torch.tensor(lens, dtype=torch.int32, device="cuda")
        q = torch.randn(len(lens) * ql, hq, D, generator=gen, device="cuda").bfloat16()
        ref = reference.spec_verify(q, cache, bt, sl, D ** -0.5, k).cuda()
        a = mtp_verify.verify_attention(q, cache, bt, sl, D ** -0.5, k)  # bf16 out, as (b), (c), (d)
        syn_sl = mtp_verify.synthetic_lengths(sl, len(lens), k)
        syn_bt = bt.repeat_interleave(ql, 0)
        eye, cz = torch.eye(D, device="cuda"), torch.zeros(16, device="cuda")
        c = vllm_entry.decode(q, cache, syn_bt, syn_sl, eye, cz, D ** -0.5, 0, D, 4, key_fp8=True)
        bv = vl.decode(q, cache, syn_bt, syn_sl, eye, cz, D ** -0.5, 0, D, 4, key_fp8=True)
        qd = q.view(len(lens), ql, hq, D)[:, -1].contiguous()
        d = vllm_entry.decode(qd, cache, bt, sl, eye, cz, D ** -0.5, 0, D, 4, key_fp8=True)
        ref_d = reference.decode(qd.cpu(), cache.cpu(), bt.cpu(), sl.cpu(), D ** -0.5).cuda()
        torch.cuda.synchronize()
        r = dict(hq=hq, k=k, err_a=rel(a, ref), err_b=rel(bv, ref), err_c=rel(c, ref), err_d=rel(d, ref_d),
                 a_nan=bool(a.isnan().any()))
        log(f"check Hq {hq} K {k}: rel err vs float64  (a) {r['err_a']:.2e}  (b) vLLM {r['err_b']:.2e}  "
            f"(c) {r['err_c']:.2e}  (d) {r['err_d']:.2e}")
        rows.append(r)
    return rows


# (a0): one warp per KV head, a block per 16-row chunk, softmax_tile
_pw = mtp_verify.per_warp  # a per-warp kernel variant at every row count


TODAY = _pw(chunk_warps=1, kchain=1, softmax=0, merge_rows=0)  # (and the block merge)
TILE = _pw(unpack=0, rows_per_warp=16, softmax=0)  # the shared-tile CTA: 16-row warps
PER_WARP = _pw()  # (aw): the per-warp kernel everywhere (round 6's default)
PROBE = {
    "before27": TODAY,
    "tile": TILE,
    "unpack": _pw(unpack=1),  # the shared-unpack CTA where > 16 rows (its own plan)
    "unpack_2buf": _pw(unpack=1, unpack_buffers=2),  # two unpacked tiles (one barrier a tile)
    "wide8": _pw(rows_per_warp=32, softmax=0),  # wide warps, all 8 heads a block (<= 8 warps)
    "wide4": _pw(rows_per_warp=32, heads_per_block=4, softmax=0),
    "pw": PER_WARP,
    "default": mtp_verify.DEFAULT,  # the shipped build (the warp-specialised wgmma kernel at > 16 rows)
    "smx0": _pw(softmax=0),  # decode_k8v4.cu's softmax_tile
    "smx1": _pw(softmax=1),  # softmax_tile_mma: one FFMA a score, l / z by one MMA an n-tile
    "smx2": _pw(softmax=2),  # the same with ex2.approx.f16x2
    "st5": _pw(softmax=0, stages=5),  # 4 tiles in flight instead of 2
    "smx1_st5": _pw(softmax=1, stages=5),
    "wide4_s1": _pw(rows_per_warp=32, heads_per_block=4, softmax=1),
    # the warp-specialised pair (17..32 rows): a score warp and a P.V warp per KV head, sm_90a
    "ws": _pw(ws=1),
    "ws_st3": _pw(ws=1, ws_stages=3),
    "ws_st6": _pw(ws=1, ws_stages=6),
    "ws8": _pw(ws=1, heads_per_block=8),
    "ws_r96": _pw(ws=1, ws_regs=(96, 160)),  # (the P.V warps spill 96 bytes under NVRTC 13.5)
    "ws_r104": _pw(ws=1, ws_regs=(104, 152)),  # (112 bytes)
    # the ring's depth and the bytes a block copies per token row (4 or all 8 KV heads a block)
    "st6": _pw(stages=6),  # 5 tiles in flight, 2 blocks per SM
    "w8": _pw(wide_heads=8),  # whole token rows, 1 block of 8 warps per SM
    "w8_st5": _pw(wide_heads=8, stages=5),
    "w8_st6": _pw(wide_heads=8, stages=6),
    # the warp-per-row merge (the default) against the block-per-row merge
    "merge_block": _pw(merge_rows=0),
    # the one-warpgroup MMA kernel (verify_wgmma.cu's tq_k8v4_verify_wg): tiles a stage x stages, blocks per SM
    "wg_t4": mtp_verify.VerifyConfig(wgmma=1, wg=verify_wg.WgConfig(f16_stages=0)),  # 4 x 3, 2 blocks per SM
    "wg": mtp_verify.VerifyConfig(wgmma=1, wg=verify_wg.WgConfig(2, 4, 3, f16_stages=0)),  # 2 x 4, 3 blocks per SM
    "wg_t1": mtp_verify.VerifyConfig(wgmma=1, wg=verify_wg.WgConfig(1, 6, 3, f16_stages=0)),
    "wg_w2": mtp_verify.VerifyConfig(wgmma=1, wg=verify_wg.WgConfig(2, 4, 3, f16_stages=0), waves=2),  # two waves
    # the warp-specialised one (tq_k8v4_verify_ws): a converting warpgroup feeds the MMA warpgroup a ring of f16
    # stages (tiles a stage x copy stages, f16 stages, blocks per SM)
    "ws_t4": mtp_verify.VerifyConfig(wgmma=1),  # (the default: 4 x 3, 2 f16 stages, 2 blocks per SM)
    "ws_t2": mtp_verify.VerifyConfig(wgmma=1, wg=verify_wg.WgConfig(2, 4, 2, f16_stages=4)),  # 2 x 4, 4 f16
    "ws_1b": mtp_verify.VerifyConfig(wgmma=1, wg=verify_wg.WgConfig(4, 2, 1, f16_stages=3, regs=(96, 232))),
}
# round 10: verify_tr.cu (keys and values into the MMA warps' registers), 2 or 3 blocks per SM, 3 or 4 copied stages
PROBE["tr"] = mtp_verify.VerifyConfig(wgmma=1, wg=verify_wg.WgConfig(transposed=True))
PROBE["tr_b3"] = mtp_verify.VerifyConfig(wgmma=1, wg=verify_wg.WgConfig(min_blocks=3, transposed=True))
PROBE["tr_s4"] = mtp_verify.VerifyConfig(wgmma=1, wg=verify_wg.WgConfig(stages=4, transposed=True))
# (one block of 128 threads serves a split: about two or three waves of them keep 3 blocks an SM)
PROBE["tr_w2"] = mtp_verify.VerifyConfig(wgmma=1, wg=verify_wg.WgConfig(transposed=True), waves=2)
PROBE["tr_w3"] = mtp_verify.VerifyConfig(wgmma=1, wg=verify_wg.WgConfig(transposed=True), waves=3)
PROBE["tr_b3_w2"] = mtp_verify.VerifyConfig(wgmma=1, wg=verify_wg.WgConfig(min_blocks=3, transposed=True), waves=2)
# round 8's kernel: its rows 16 w + g and + 8 (two warps idle at <= 32 rows), an f16 stage freed after the next one's
# scores; and each change alone
PROBE["ws_r8"] = mtp_verify.VerifyConfig(wgmma=1, wg=verify_wg.WgConfig(spread_rows=False, early_free=False))
PROBE["ws_spread"] = mtp_verify.VerifyConfig(wgmma=1, wg=verify_wg.WgConfig(early_free=False))
PROBE["ws_early"] = mtp_verify.VerifyConfig(wgmma=1, wg=verify_wg.WgConfig(spread_rows=False))
# Diagnostics (wrong outputs): ws_t4 without its score wgmmas (1), P.V wgmmas (2), both (3), tensor copies (4),
# copies and MMAs (7), conversion (8), the f16 value stores (16: unpacked, not stored), those and the P.V (18: no
# f16 value byte through shared memory): what each part of the pipeline costs
for _d in (1, 2, 3, 4, 7, 8, 11, 16, 18):  # (8: the copies are still waited for)
    PROBE[f"ws_dbg{_d}"] = mtp_verify.VerifyConfig(wgmma=1, wg=verify_wg.WgConfig(f16_stages=2, debug=_d))
# Diagnostics: the same builds with the tile math left out (verify_k8v4.cu's RING_ONLY; the outputs are wrong), at
# the split count of the full build, to time what the TMA ring alone delivers. Marked by tau (unused without the
# math), which keeps them apart from the full builds in mtp_verify's plan cache.
RING_TAU = 7.75
for _n in ("pw", "st6", "w8", "w8_st6"):  # (the per-warp kernel's RING_ONLY)
    PROBE["ring_" + _n] = dataclasses.replace(PROBE[_n], tau=RING_TAU)


def _ring_only_hooks() -> None:
    defines, build = mtp_verify.defines, mtp_verify._build

    def ring_defines(*a, **kw):
        out = defines(*a, **kw)
        cfg = kw.get("cfg", a[7] if len(a) > 7 else mtp_verify.DEFAULT)
        return out | {"RING_ONLY": 1} if cfg.tau == RING_TAU else out

    def ring_build(key):
        k, merge, blocks, nb, warps, wg = build(key)
        if key[9].tau == RING_TAU:  # the full build's blocks per SM, so the same split count
            blocks = build(key[:9] + (dataclasses.replace(key[9], tau=8.0),) + key[10:])[2]
        return k, merge, blocks, nb, warps, wg

    mtp_verify.defines, mtp_verify._build = ring_defines, ring_build


_ring_only_hooks()


def plan_of(hq: int, k: int, cfg, b: int) -> str:
    if verify_wg.uses(cfg, hq, HK, D, k + 1, HK * SLOT, 16, b):
        return f"wg {cfg.wg.tiles_per_stage}t{cfg.wg.stages}s" + (f" ws{cfg.wg.f16_stages}" if cfg.wg.f16_stages else "")
    p = mtp_verify.block_plan(hq, HK, D, k + 1, HK * SLOT, SLOT, cfg)
    smx = mtp_verify.defines(hq, HK, D, PAGE, HK * SLOT, True, k + 1, cfg)["SMX"]
    return (f"{p.hpb}x{p.ncw}w/{p.nchb}b" + (f" u{p.ubuf}" if p.shu else "") + (f" s{smx}" if smx else "")
            + (" ws" if p.ws else ""))


def probe(vl, pools, names=tuple(PROBE)) -> list[dict]:
    """Block plans and variants (``names`` of PROBE) on the cells with more than 16 query rows per KV head
    (B >= 8)."""
    rows = []
    plain: dict = {}
    for ctx in CTXS:
        for b in (8, 32):
            for hq in HQS:
                for k in (3, 5, 7):
                    if (hq // HK) * (k + 1) <= 16:
                        continue
                    cell = Cell(pools[ctx], b, k, hq, vl)
                    ts = {}
                    for name in names:
                        cfg = PROBE[name]
                        ts[name] = graph_us(lambda cfg=cfg, cell=cell, k=k: mtp_verify.verify_attention(
                            cell.q, cell.cache, cell.bt, cell.sl, cell.scale, k, out=cell.out, config=cfg))
                    key = (ctx, b, hq)
                    if key not in plain:  # (d): one plain decode step, the targets' denominator
                        plain[key] = graph_us(cell.d)
                    rows.append(dict(b=b, ctx=ctx, hq=hq, k=k, d=plain[key], **ts))
                    log(f"probe B {b} ctx {ctx} Hq {hq} K {k} (d) {plain[key]:.1f}: " + "  ".join(
                        f"{n}[{plan_of(hq, k, PROBE[n], b)}] {t:.1f} ({t / plain[key]:.2f}x d)" for n, t in ts.items()))
                    del cell
    return rows


# --small: at <= 16 query rows per KV head the default runs the per-warp kernel; these time the warpgroup kernels
# there (wgmma=2: at every row count) against it, by batch and context
SMALL = {
    "pw": PER_WARP,
    "ws_all": mtp_verify.VerifyConfig(wgmma=2),
    "tr_all": mtp_verify.VerifyConfig(wgmma=2, wg=verify_wg.WgConfig(transposed=True)),
    "tr_b3_all": mtp_verify.VerifyConfig(wgmma=2, wg=verify_wg.WgConfig(min_blocks=3, transposed=True)),
}
SMALL_BS = (1, 2, 4, 8, 16, 32)
SMALL_CTXS = (2048, 8192, 32768)
SMALL_HQS = (8, 16, 32, 48, 64)  # G = 1, 2, 4, 6, 8 (Hk 8)
SMALL_KS = (1, 3, 7)


def small(vl, pools) -> list[dict]:
    """SMALL's variants on every cell of SMALL_HQS x SMALL_KS with at most 16 query rows per KV head, B in SMALL_BS, every
    context of SMALL_CTXS; each checked against the per-warp kernel's output (max |diff|) before it is timed."""
    rows = []
    for ctx in SMALL_CTXS:
        for hq in SMALL_HQS:
            for k in SMALL_KS:
                if (hq // HK) * (k + 1) > 16:
                    continue
                for b in SMALL_BS:
                    cell = Cell(pools[ctx], b, k, hq, vl)
                    ts, diff = {}, {}
                    ref = None
                    for name, cfg in SMALL.items():
                        def run(cfg=cfg, cell=cell, k=k):
                            return mtp_verify.verify_attention(cell.q, cell.cache, cell.bt, cell.sl, cell.scale, k,
                                                               out=cell.out, config=cfg)
                        got = run().float().clone()
                        ref = got if ref is None else ref
                        diff[name] = (got - ref).abs().max().item()
                        ts[name] = graph_us(run)
                    td = graph_us(cell.d)
                    rows.append(dict(b=b, ctx=ctx, hq=hq, k=k, d=td, **ts, diff=diff))
                    log(f"small B {b} ctx {ctx} Hq {hq} K {k} rows {(hq // HK) * (k + 1)} (d) {td:.1f}: " + "  ".join(
                        f"{n} {t:.1f} ({t / ts['pw']:.3f}x pw, diff {diff[n]:.1e})" for n, t in ts.items()))
                    del cell
    return rows


def table(vl, pools, bw, quick=False) -> list[dict]:
    rows = []
    d_cache: dict = {}
    for hq in HQS:
        for ctx in CTXS:
            for b in BS:
                for k in KS:
                    if quick and not (b in (8, 32) and k == 3):
                        continue
                    cell = Cell(pools[ctx], b, k, hq, vl)
                    ta = graph_us(cell.a)
                    # one build (<= 16 rows) and one merge (TODAY's: the block merge, not the default's warp merge)
                    same = plan_of(hq, k, mtp_verify.DEFAULT, b) == plan_of(hq, k, TODAY, b) \
                        and mtp_verify.DEFAULT.merge_rows == TODAY.merge_rows
                    ta0 = ta if same else graph_us(lambda cell=cell: mtp_verify.verify_attention(
                        cell.q, cell.cache, cell.bt, cell.sl, cell.scale, cell.k, out=cell.out, config=TODAY))
                    samew = plan_of(hq, k, mtp_verify.DEFAULT, b) == plan_of(hq, k, PER_WARP, b)
                    taw = ta if samew else graph_us(lambda cell=cell: mtp_verify.verify_attention(
                        cell.q, cell.cache, cell.bt, cell.sl, cell.scale, cell.k, out=cell.out, config=PER_WARP))
                    tb = eager_us(cell.b_vllm, n=3 if b * ctx >= 32 * 32768 else 5)
                    tc = graph_us(cell.c)
                    key = (hq, ctx, b)
                    if key not in d_cache:
                        d_cache[key] = graph_us(cell.d)
                    td = d_cache[key]
                    gbs = cell.bytes / (ta * 1e-6) / 1e9
                    r = dict(hq=hq, ctx=ctx, b=b, k=k, a=ta, a0=ta0, aw=taw, same_plan=same, same_wide=samew,
                             plan=plan_of(hq, k, mtp_verify.DEFAULT, b), plan_wide=plan_of(hq, k, PER_WARP, b),
                             b_vllm=tb, c=tc, d=td, gbs=gbs, pct=100 * gbs / bw,
                             a_over_d=ta / td, a0_over_d=ta0 / td, c_over_a=tc / ta, b_over_a=tb / ta)
                    rows.append(r)
                    log(fmt(r))
                    del cell
                    torch.cuda.empty_cache()
    return rows


HEADER = ("| Hq/Hk | B | ctx | K | plan (heads x warps / chunk blocks) | (a) sndr verify, graph us | "
          "(aw) per-warp kernel, graph us | (a0) before issue 27, graph us | GB/s | %BW | (b) vLLM path, eager us | "
          "(c) synthetic rows PK0001, graph us | (d) PK0001 plain decode, graph us | a/d | aw/d | a0/d | c/a | b/a | "
          "targets |")

# issue 27: a/d limits per K (B >= 8, ctx >= 8K)
AD_LIMIT = {3: 1.3, 5: 1.5, 7: 1.8}


def goals(r) -> str:
    out = []
    big = r["b"] >= 8 and r["ctx"] >= 8192
    lim = AD_LIMIT.get(r["k"])
    if big and lim:
        out.append(f"<={lim}x d {'ok' if r['a_over_d'] <= lim else 'MISS'}")
        if r["a0_over_d"] <= lim:  # met by the kernel before issue 27: may not get > 3% slower
            out.append(f"<=+3% vs a0 {'ok' if r['a'] <= 1.03 * r['a0'] else 'MISS'}")
    if big and r["k"] >= 3:
        out.append(f">=2x vs c {'ok' if r['c_over_a'] >= 2 else 'MISS'}")
    if r["b"] == 32 and r["ctx"] == 8192 and r["k"] == 3:
        out.append(f">=30x vs b {'ok' if r['b_over_a'] >= 30 else 'MISS'}")
    return ", ".join(out) or "-"


def fmt(r) -> str:
    a0 = "=" if r["same_plan"] else f"{r['a0']:.1f}"
    aw = "=" if r["same_wide"] else f"{r['aw']:.1f} ({r['plan_wide']})"
    return (f"| {r['hq']}/{HK} | {r['b']} | {r['ctx'] // 1024}K | {r['k']} | {r['plan']} | {r['a']:.1f} | {aw} | "
            f"{a0} | {r['gbs']:.0f} | {r['pct']:.0f}% | {r['b_vllm']:,.0f} | {r['c']:.1f} | {r['d']:.1f} | "
            f"{r['a_over_d']:.2f} | {r['aw'] / r['d']:.2f} | {r['a0_over_d']:.2f} | {r['c_over_a']:.2f} | "
            f"{r['b_over_a']:.1f} | {goals(r)} |")


def ncu_launch(cfg, hq: int = 64, k: int = 3, b: int = 32, ctx: int = 8192) -> int:
    """One warm-up call (build, load) then one timed-by-ncu call of the verify kernel with ``cfg``."""
    cell = Cell(Pool(b, ctx), b, k, hq, None)
    for _ in range(2):
        mtp_verify.verify_attention(cell.q, cell.cache, cell.bt, cell.sl, cell.scale, k, out=cell.out, config=cfg)
    torch.cuda.synchronize()
    log(f"ncu launch: Hq {hq} K {k} B {b} ctx {ctx} plan {plan_of(hq, k, cfg, b)} {cfg}")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="B 8 and 32, K 3 only")
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--probe", action="store_true")
    ap.add_argument("--no-table", action="store_true")
    ap.add_argument("--small", action="store_true", help="time SMALL's variants at <= 16 query rows per KV head")
    ap.add_argument("--variants", default=",".join(PROBE), help="--probe: these PROBE names, comma-separated")
    ap.add_argument("--ncu-launch", metavar="NAME",
                    help="one launch of PROBE[NAME] at Hq 64, K 3, B 32, 8K (after one warm-up call), for ncu; "
                         "nothing else runs")
    ap.add_argument("--out", default=os.environ.get("OUT", str(ROOT / ".bench")))
    ap.add_argument("--vllm", default="0.32.0", metavar="X",
                    help="time vLLM X's kernels as the baseline (.baselines/vllm-X_tq, the tree cache, else fetched); "
                         "the JSON then names it: a `pin advance --perf-ref` for PK0002 on a bump to X")
    args = ap.parse_args(argv)
    names = [n for n in args.variants.split(",") if n]
    unknown = [n for n in names + ([args.ncu_launch] if args.ncu_launch else []) if n not in PROBE]
    if unknown:
        ap.error(f"unknown variants {unknown}; known: {', '.join(PROBE)}")
    if args.ncu_launch:
        return ncu_launch(PROBE[args.ncu_launch])
    src = _vllm_baseline.find_dir(ROOT, args.vllm, fetch=True)
    if src is None:
        log(f"vLLM {args.vllm}'s TurboQuant files not found (.baselines/vllm-{args.vllm}_tq); copy them from the wheel")
        return 2
    vl = _vllm_baseline.load(src)
    log("device:", _tq_gpu.device_line())
    bw = _tq_gpu.copy_bandwidth()
    log(f"copy bandwidth: {bw:.0f} GB/s (2 GiB device-to-device, read + write)")
    out = {"plugin": "PK0002", "vllm": args.vllm, "baseline_dir": str(src), "device": _tq_gpu.device_line(),
           "copy_gbs": bw, "argv": sys.argv}
    if args.check:
        out["check"] = check(vl)
    t0 = time.time()
    sp = HK * SLOT
    shapes: list[tuple] = [(hq, HK, D, PAGE, sp, True, k + 1) for hq in HQS for k in KS + (0,)]
    if args.probe:
        shapes += [(hq, HK, D, PAGE, sp, True, k + 1, cfg) for hq in HQS for k in (3, 5, 7)
                   for cfg in (PROBE[n] for n in names) if (hq // HK) * (k + 1) > 16]
    if not args.no_table:
        shapes += [(hq, HK, D, PAGE, sp, True, k + 1, cfg) for hq in HQS for k in KS for cfg in (TODAY, PER_WARP)]
    if args.small:
        shapes += [(hq, HK, D, PAGE, sp, True, k + 1, cfg) for hq in SMALL_HQS for k in SMALL_KS
                   for cfg in SMALL.values() if (hq // HK) * (k + 1) <= 16]
    mtp_verify.precompile(shapes, workers=12)
    log(f"compiled {len(shapes)} verify builds in {time.time() - t0:.0f} s")
    pools = {ctx: Pool(max(BS), ctx) for ctx in CTXS}
    if args.small:
        pools |= {ctx: Pool(max(SMALL_BS), ctx) for ctx in SMALL_CTXS if ctx not in pools}
        out["small"] = small(vl, pools)
    if args.probe:
        out["probe"] = probe(vl, pools, names)
    if not args.no_table:
        log(HEADER)
        log("|" + "---|" * 19)
        rows = table(vl, pools, bw, args.quick)
        out["table"] = rows
        for hq in HQS:
            for ctx in CTXS:
                r = next((x for x in rows if x["hq"] == hq and x["ctx"] == ctx and x["b"] == 32 and x["k"] == 3), None)
                if r:
                    log(f"{LAYERS}-layer step, B=32 K=3 Hq {hq} ctx {ctx // 1024}K: upstream (b) "
                        f"{LAYERS * r['b_vllm'] / 1e3:.1f} ms, sndr (a) {LAYERS * r['a'] / 1e3:.2f} ms "
                        f"({r['b_over_a']:.0f}x), plain decode (d) {LAYERS * r['d'] / 1e3:.2f} ms")
    log(f"table time {time.time() - t0:.0f} s")
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "bench_mtp_verify.json").write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
