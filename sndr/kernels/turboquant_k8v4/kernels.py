"""Triton kernels for the TurboQuant k8v4 cache: split-KV decode, merge (the store: ``cache_store``).

This module is the Triton backend only (``triton_decode_attention``); the
backend choice is ``dispatch.decode_attention`` (the package's
``decode_attention``).

Layout: see ``_layout``. Every slot starts at a multiple of 4 bytes (the slot
size is D + D/2 + 4 with D a power of two), so the decode reads the cache as
int32 words: 4 key bytes or 8 value codes per load, one scale|zero word.

Decode, one query token per sequence:

* ``_decode_split_kernel``, grid (B, Hk, S): one program per KV head and
  split of the context, holding the G = Hq/Hk query heads of its group as the
  rows of a [BLOCK_H, D] tile, so each KV tile is read from memory once per
  group. A tile is whole pages: one block-table entry and one 64-bit base per
  page, the in-page row offsets are constexpr strides that fold into load
  immediates; full tiles load without predicates, only a split's last tile is
  masked; the next tile's words are loaded before the current one computes.
  Scores and P@V run on tensor cores (fp16 operands, fp32 accumulation): fp8
  e4m3 -> fp16 is exact (``cvt.rn.f16x2.e4m3x2``), and the 4-bit codes become
  fp16 1024 + code exactly through ``prmt`` with 0x64 (no int->float
  conversions). The value scale multiplies P before the dot; the value zero
  is a rank-one term kept as a running sum. The unpacked operands pass an
  opaque identity (``_opaque_f16``) so Triton gives the dots kWidth=2
  operands (ldmatrix, no register shuffles) instead of the kWidth=4 it infers
  from the joins of the unpack. Softmax state is updated lazily (``LAZY``):
  l and z are per-element partial sums reduced once after the loop, the dot
  accumulates P@V in place, and the running max / scale max are raised (with a
  rescale) only when a tile exceeds them, so the common tile has one
  cross-warp reduction. Two shapes ship (``SHIPPED``): 4 warps x 64 tokens for
  small batches, 1 warp x 16 tokens (no cross-warp traffic at all, 8-12
  programs per SM) from B*Hk = 64 up.
* ``_merge_kernel``, grid (B, Hq): log-sum-exp merge of the splits.

The grid depends on B, Hk and S only, never on the sequence lengths, so the
pair can be captured in a CUDA graph; S is picked from B * Hk to fill whole
waves of programs (where max_splits caps that, the fullest last wave). A
sequence uses min(S, tokens / min_split_tokens) splits; programs past them
exit at once. Under TRITON_INTERPRET=1 the PTX pieces are
replaced by plain integer ops (same values).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .. import _cudart
from ._layout import FP8_MAX, LN2, LOG2E, Layout, workspace_numel  # noqa: F401  (re-exported)
from .cache_store import check_cache

FP8_MAX_C = tl.constexpr(FP8_MAX)
LN2_C = tl.constexpr(LN2)


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


# ----------------------------------------------------------------------------- decode


@triton.jit
def _active_splits(seq_len, num_splits, min_tiles, BLOCK_N: tl.constexpr):
    """(splits holding tokens, tiles per split) for one sequence."""
    n_tiles = tl.cdiv(seq_len, BLOCK_N)
    act = tl.minimum(num_splits, tl.cdiv(n_tiles, min_tiles))
    tiles_per = tl.maximum(tl.cdiv(n_tiles, tl.maximum(act, 1)), 1)
    return tl.cdiv(n_tiles, tiles_per), tiles_per


@triton.jit
def _unpack_nibbles_asm(vb):
    """uint8 [..] -> (low, high) nibbles as fp16 1024 + code, 4 bytes per PRMT pair."""
    return tl.inline_asm_elementwise(
        asm="""
        {
        .reg .b32 lo, hi;
        and.b32 lo, $4, 0x0F0F0F0F;
        shr.u32 hi, $4, 4;
        and.b32 hi, hi, 0x0F0F0F0F;
        prmt.b32 $0, lo, 0x64646464, 0x5140;
        prmt.b32 $1, lo, 0x64646464, 0x7362;
        prmt.b32 $2, hi, 0x64646464, 0x5140;
        prmt.b32 $3, hi, 0x64646464, 0x7362;
        }
        """,
        constraints="=r,=r,=r,=r,r",
        args=[vb],
        dtype=(tl.float16, tl.float16),
        is_pure=True,
        pack=4,
    )


@triton.jit
def _fp8_words_asm(kw):
    """int32 words of 4 e4m3 bytes -> 4 fp16 tensors (byte 0..3), two cvt per word."""
    return tl.inline_asm_elementwise(
        asm="""
        {
        .reg .b16 l, h;
        .reg .b32 a, b;
        mov.b32 {l, h}, $4;
        cvt.rn.f16x2.e4m3x2 a, l;
        cvt.rn.f16x2.e4m3x2 b, h;
        mov.b32 {$0, $1}, a;
        mov.b32 {$2, $3}, b;
        }
        """,
        constraints="=h,=h,=h,=h,r",
        args=[kw],
        dtype=(tl.float16, tl.float16, tl.float16, tl.float16),
        is_pure=True,
        pack=1,
    )


@triton.jit
def _nibble_words_asm(vw):
    """int32 words of 8 codes -> 8 fp16 tensors 1024 + code (nibble 0..7)."""
    return tl.inline_asm_elementwise(
        asm="""
        {
        .reg .b32 lo, hi, a, b, c, d;
        and.b32 lo, $8, 0x0F0F0F0F;
        shr.u32 hi, $8, 4;
        and.b32 hi, hi, 0x0F0F0F0F;
        prmt.b32 a, lo, 0x64646464, 0x5140;
        prmt.b32 b, lo, 0x64646464, 0x7362;
        prmt.b32 c, hi, 0x64646464, 0x5140;
        prmt.b32 d, hi, 0x64646464, 0x7362;
        mov.b32 {$0, $2}, a;
        mov.b32 {$4, $6}, b;
        mov.b32 {$1, $3}, c;
        mov.b32 {$5, $7}, d;
        }
        """,
        constraints="=h,=h,=h,=h,=h,=h,=h,=h,r",
        args=[vw],
        dtype=(tl.float16,) * 8,
        is_pure=True,
        pack=1,
    )


@triton.jit
def _opaque_f16(x):
    """Identity on fp16 pairs that Triton cannot look through (not pure): stops
    AccelerateMatmul's bit-width walk at this point, so the dot keeps kWidth=2."""
    return tl.inline_asm_elementwise(
        asm="mov.b32 $0, $1;", constraints="=r,r", args=[x], dtype=tl.float16, is_pure=False, pack=2)


@triton.jit
def _load_tile(
    n0, end, KV8, KV32, bt_row, head_off,
    D: tl.constexpr, PAGE: tl.constexpr, BLOCK_N: tl.constexpr, TP: tl.constexpr, TT: tl.constexpr,
    STRIDE_BLK: tl.constexpr, STRIDE_POS: tl.constexpr, MASKED: tl.constexpr, WORDS: tl.constexpr = False,
):
    """Raw bytes of the BLOCK_N tokens from n0: keys [N, D] u8, codes [N, D/2] u8,
    scale|zero<<16 words [N] i32, token mask [N]. A tile is TP pages x TT tokens.

    MASKED=False for tiles wholly before ``end``: no predicates, no zero fills.
    """
    d = tl.arange(0, D)
    j = tl.arange(0, D // 2)
    pidx = n0 // PAGE + tl.arange(0, TP)  # [TP] logical page numbers
    o0 = n0 % PAGE  # 0 unless a page spans several tiles
    tt = tl.arange(0, TT)
    row_off = tt * STRIDE_POS  # compile-time multiples: they fold into load immediates
    tmask = (pidx[:, None] * PAGE + o0 + tt[None, :]) < end  # [TP, TT]
    if MASKED:
        pg = tl.load(bt_row + pidx, mask=pidx * PAGE + o0 < end, other=0)
    else:
        pg = tl.load(bt_row + pidx)
    pbase = pg.to(tl.int64) * STRIDE_BLK + head_off + o0 * STRIDE_POS  # [TP]
    addr = pbase[:, None, None] + row_off[None, :, None]  # [TP, TT, 1]
    meta = addr // 4 + (D + D // 2) // 4  # int32 index of the scale|zero word
    if WORDS:
        # int32 words: 4 key bytes / 8 value codes each, nothing unpacked until used
        w = addr // 4
        kdw = tl.arange(0, D // 4)
        vdw = tl.arange(0, D // 8)
        if MASKED:
            m3 = tmask[:, :, None]
            kb = tl.load(KV32 + w + kdw[None, None, :], mask=m3, other=0)
            vb = tl.load(KV32 + w + (D // 4 + vdw)[None, None, :], mask=m3, other=0)
            sz = tl.load(KV32 + meta, mask=m3, other=0)
        else:
            kb = tl.load(KV32 + w + kdw[None, None, :])
            vb = tl.load(KV32 + w + (D // 4 + vdw)[None, None, :])
            sz = tl.load(KV32 + meta)
        kb = tl.reshape(kb, [BLOCK_N, D // 4])
        vb = tl.reshape(vb, [BLOCK_N, D // 8])
    else:
        if MASKED:
            m3 = tmask[:, :, None]
            kb = tl.load(KV8 + addr + d[None, None, :], mask=m3, other=0)
            vb = tl.load(KV8 + addr + (D + j)[None, None, :], mask=m3, other=0)
            sz = tl.load(KV32 + meta, mask=m3, other=0)
        else:
            kb = tl.load(KV8 + addr + d[None, None, :])
            vb = tl.load(KV8 + addr + (D + j)[None, None, :])
            sz = tl.load(KV32 + meta)
        kb = tl.reshape(kb, [BLOCK_N, D])
        vb = tl.reshape(vb, [BLOCK_N, D // 2])
    return kb, vb, tl.reshape(sz, [BLOCK_N]), tl.reshape(tmask, [BLOCK_N])


@triton.jit
def _unpack_tile(kb, vb, ASM_UNPACK: tl.constexpr, WORDS: tl.constexpr, OPAQUE: tl.constexpr):
    """Raw tile -> keys [N, D] fp16 (exact) and value codes [N, D] fp16 (exact)."""
    if WORDS:
        k0, k1, k2, k3 = _fp8_words_asm(kb)
        k = tl.interleave(tl.interleave(k0, k2), tl.interleave(k1, k3))
        c0, c1, c2, c3, c4, c5, c6, c7 = _nibble_words_asm(vb)
        c = tl.interleave(tl.interleave(tl.interleave(c0, c4), tl.interleave(c2, c6)),
                          tl.interleave(tl.interleave(c1, c5), tl.interleave(c3, c7)))
        c = (c - 1024.0).to(tl.float16)
        if OPAQUE:
            k = _opaque_f16(k)
            c = _opaque_f16(c)
    else:
        k = kb.to(tl.float8e4nv, bitcast=True).to(tl.float16)
        if ASM_UNPACK:
            lo, hi = _unpack_nibbles_asm(vb)
        else:
            # 4-bit code c -> fp16 bits 0x6400|c = 1024 + c, exact; minus 1024 is exact too
            v16 = vb.to(tl.int16)
            lo = ((v16 & 0xF) | 0x6400).to(tl.float16, bitcast=True)
            hi = ((v16 >> 4) | 0x6400).to(tl.float16, bitcast=True)
        c = (tl.interleave(lo, hi) - 1024.0).to(tl.float16)
    return k, c


@triton.jit
def _attend_tile(
    kb, vb, sz, nmask, q, m_i, l_i, z_i, acc, s_run, qk_scale,
    ASM_UNPACK: tl.constexpr, MASKED: tl.constexpr, WORDS: tl.constexpr, OPAQUE: tl.constexpr,
    LAZY: tl.constexpr, TAU: tl.constexpr,
):
    """Online-softmax update of (m, l, z, acc, s_run) with one tile of raw cache data.

    LAZY=False: l, z are per-row [H]; acc is exact, rescaled every tile.
    LAZY=True: l, z are per-element [H, N] partial sums (summed once, at the end:
    no cross-warp reductions per tile); acc holds sum p * scale * code / s_run and
    is accumulated by the dot itself; the running max m and the running scale max
    s_run are only raised (with a rescale of the state) when a row's tile max
    exceeds m by more than TAU (log2 units) or a scale exceeds s_run, so most
    tiles do no rescaling at all. p <= 2**TAU and scale / s_run <= 1 keep the fp16
    operand P * scale / s_run within range.
    """
    sc = (sz & 0xFFFF).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
    zr = (sz >> 16).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
    k, c = _unpack_tile(kb, vb, ASM_UNPACK, WORDS, OPAQUE)
    qk = tl.dot(q, tl.trans(k)) * qk_scale  # [BLOCK_H, BLOCK_N], log2 units
    if MASKED:
        qk = tl.where(nmask[None, :], qk, float("-inf"))
    if LAZY:
        # one reduction on the common path: does any score or scale leave the bounds?
        out = (qk > (m_i + TAU)[:, None]) | (sc > s_run)[None, :]
        if tl.max(out.to(tl.int32)) > 0:
            m_new = tl.maximum(m_i, tl.max(qk, 1))
            s_new = tl.maximum(s_run, tl.max(sc, 0))
            alpha = tl.exp2(m_i - m_new)
            l_i = l_i * alpha[:, None]
            z_i = z_i * alpha[:, None]
            acc = acc * (alpha * (s_run / s_new))[:, None]
            m_i = m_new
            s_run = s_new
        p = tl.exp2(qk - m_i[:, None])
        l_i += p
        z_i += p * zr[None, :]
        pv = (p * (sc * (1.0 / s_run))[None, :]).to(tl.float16)
        acc = tl.dot(pv, c, acc)
    else:
        # normalise the scales by the tile max so p*scale cannot leave fp16's range
        scm = tl.maximum(tl.max(sc, 0), 1e-30)
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(qk - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        z_i = z_i * alpha + tl.sum(p * zr[None, :], 1)
        pv = (p * (sc / scm)[None, :]).to(tl.float16)
        acc = acc * alpha[:, None] + tl.dot(pv, c) * scm
        m_i = m_new
    return m_i, l_i, z_i, acc, s_run


@triton.jit(do_not_specialize=["num_splits", "min_tiles"])  # one build for every split count
def _decode_split_kernel(
    Q, KV8, KV32, BT, SL, MID_O, MID_L,
    qk_scale,  # softmax scale * log2(e)
    num_splits, min_tiles,
    stride_qb, stride_qh, stride_btb,
    HQ: tl.constexpr, G: tl.constexpr, BLOCK_H: tl.constexpr, D: tl.constexpr,
    PAGE: tl.constexpr, BLOCK_N: tl.constexpr,
    # cache strides in bytes, multiples of 4; constexpr so that in-page row
    # offsets fold into load immediates and each page costs one base address
    STRIDE_BLK: tl.constexpr, STRIDE_POS: tl.constexpr, STRIDE_HEAD: tl.constexpr,
    ASM_UNPACK: tl.constexpr, PREFETCH: tl.constexpr, WORDS: tl.constexpr,
    OPAQUE: tl.constexpr = False, LAZY: tl.constexpr = False, TAU: tl.constexpr = 8.0,
):
    b = tl.program_id(0)
    hk = tl.program_id(1)
    s = tl.program_id(2)
    seq_len = tl.load(SL + b)
    n_act, tiles_per = _active_splits(seq_len, num_splits, min_tiles, BLOCK_N)
    if s >= n_act:
        return
    start = s * tiles_per * BLOCK_N
    end = tl.minimum(start + tiles_per * BLOCK_N, seq_len)
    full_end = start + ((end - start) // BLOCK_N) * BLOCK_N

    TT: tl.constexpr = PAGE if PAGE < BLOCK_N else BLOCK_N
    TP: tl.constexpr = BLOCK_N // TT

    hh = tl.arange(0, BLOCK_H)
    hmask = hh < G
    qh = hk * G + hh
    d = tl.arange(0, D)
    # fp16 operands: bf16 queries convert exactly within fp16's range
    q = tl.load(Q + b * stride_qb + qh[:, None] * stride_qh + d[None, :], mask=hmask[:, None], other=0.0).to(tl.float16)
    acc = tl.zeros([BLOCK_H, D], tl.float32)  # sum_n p * scale_n * code_n
    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    if LAZY:  # per-element partial sums, reduced once after the loop
        l_i = tl.zeros([BLOCK_H, BLOCK_N], tl.float32)
        z_i = tl.zeros([BLOCK_H, BLOCK_N], tl.float32)  # sum_n p * zero_n
    else:
        l_i = tl.zeros([BLOCK_H], tl.float32)
        z_i = tl.zeros([BLOCK_H], tl.float32)  # sum_n p * zero_n
    s_run = tl.full([], 1e-30, tl.float32)  # LAZY: running max of the value scales

    bt_row = BT + b.to(tl.int64) * stride_btb
    head_off = hk.to(tl.int64) * STRIDE_HEAD
    if PREFETCH:
        # keep the next tile's loads in flight while this one computes
        kb, vb, sz, nm = _load_tile(start, end, KV8, KV32, bt_row, head_off,
                                    D, PAGE, BLOCK_N, TP, TT, STRIDE_BLK, STRIDE_POS, True, WORDS)
        for n0 in range(start, full_end, BLOCK_N):
            # the last iteration re-reads its own tile (an L2 hit) instead of branching
            nxt = tl.minimum(n0 + BLOCK_N, full_end - BLOCK_N)
            kb2, vb2, sz2, nm2 = _load_tile(nxt, end, KV8, KV32, bt_row, head_off,
                                            D, PAGE, BLOCK_N, TP, TT, STRIDE_BLK, STRIDE_POS, False, WORDS)
            m_i, l_i, z_i, acc, s_run = _attend_tile(kb, vb, sz, nm, q, m_i, l_i, z_i, acc, s_run, qk_scale,
                                                     ASM_UNPACK, False, WORDS, OPAQUE, LAZY, TAU)
            kb, vb, sz, nm = kb2, vb2, sz2, nm2
    else:
        for n0 in range(start, full_end, BLOCK_N):
            kb, vb, sz, nm = _load_tile(n0, end, KV8, KV32, bt_row, head_off,
                                        D, PAGE, BLOCK_N, TP, TT, STRIDE_BLK, STRIDE_POS, False, WORDS)
            m_i, l_i, z_i, acc, s_run = _attend_tile(kb, vb, sz, nm, q, m_i, l_i, z_i, acc, s_run, qk_scale,
                                                     ASM_UNPACK, False, WORDS, OPAQUE, LAZY, TAU)
    if full_end < end:
        kb, vb, sz, nm = _load_tile(full_end, end, KV8, KV32, bt_row, head_off,
                                    D, PAGE, BLOCK_N, TP, TT, STRIDE_BLK, STRIDE_POS, True, WORDS)
        m_i, l_i, z_i, acc, s_run = _attend_tile(kb, vb, sz, nm, q, m_i, l_i, z_i, acc, s_run, qk_scale,
                                                 ASM_UNPACK, True, WORDS, OPAQUE, LAZY, TAU)

    if LAZY:
        acc = acc * s_run
        l_i = tl.sum(l_i, 1)
        z_i = tl.sum(z_i, 1)
    safe_l = tl.where(l_i > 0.0, l_i, 1.0)
    row = (b * HQ + qh) * num_splits + s
    o = (acc + z_i[:, None]) / safe_l[:, None]
    tl.store(MID_O + row[:, None] * D + d[None, :], o, mask=hmask[:, None])
    tl.store(MID_L + row, m_i + tl.log2(safe_l), mask=hmask)


@triton.jit(do_not_specialize=["num_splits", "min_tiles"])
def _merge_kernel(
    MID_O, MID_L, SL, OUT, LSE,
    num_splits, min_tiles,
    stride_ob, stride_oh, stride_lb,
    HQ: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_S: tl.constexpr,
    WRITE_LSE: tl.constexpr,
):
    b = tl.program_id(0)
    h = tl.program_id(1)
    seq_len = tl.load(SL + b)
    n_act, _ = _active_splits(seq_len, num_splits, min_tiles, BLOCK_N)
    s = tl.arange(0, BLOCK_S)
    smask = s < n_act
    row = (b * HQ + h) * num_splits + s
    lse = tl.load(MID_L + row, mask=smask, other=float("-inf"))
    m = tl.max(lse, 0)
    m = tl.where(n_act > 0, m, 0.0)
    w = tl.exp2(lse - m)
    d = tl.arange(0, D)
    o = tl.load(MID_O + row[:, None] * D + d[None, :], mask=smask[:, None], other=0.0)
    den = tl.sum(w, 0)
    res = tl.sum(w[:, None] * o, 0) / tl.where(den > 0.0, den, 1.0)
    tl.store(OUT + b * stride_ob + h * stride_oh + d, res.to(OUT.dtype.element_ty))
    if WRITE_LSE:
        tl.store(LSE + b * stride_lb + h, (m + tl.log2(den)) * LN2_C)



@dataclass(frozen=True)
class DecodeConfig:
    block_n: int = 64
    num_warps: int = 4
    num_stages: int = 1
    num_splits: int | None = None  # None: from B, Hk and the SM count (see pick_num_splits)
    min_split_tokens: int = 128  # a sequence gets at most one split per this many tokens
    split_policy: str = "waves"  # "waves": fill whole waves of programs; "ctas": ctas_per_sm per SM
    occupancy: int = 2  # programs resident per SM ("waves" policy)
    ctas_per_sm: int = 4  # "ctas" policy target
    asm_unpack: bool = True  # PTX prmt nibble unpack (GPU); the interpreter uses plain ops
    prefetch: bool = True  # load tile i+1 while tile i computes (by hand, for num_stages=1)
    words: bool = True  # load int32 words, unpack fp8 and nibbles with PTX (GPU only)
    maxnreg: int | None = None  # register cap per thread (occupancy)
    opaque: bool = True  # fp16 dot operands with kWidth=2 (ldmatrix, no operand shuffles; GPU only)
    lazy: bool = True  # lazy rescaling, per-element l/z sums, P@V accumulated in the dot
    tau: float = 8.0  # LAZY: the running max may lag a row's true max by this much (log2 units)


def _sm_count(device: torch.device) -> int:
    """The split plan's multiprocessor count: the device's (``_cudart.sm_count``), 8 off CUDA."""
    return _cudart.sm_count(_cudart.device_index(device)) if device.type == "cuda" else 8


# Per (head_dim, G) configs measured best on an H200 (docs/bench-tq-decode-h200.md).
TUNED: dict[tuple[int, int], DecodeConfig] = {}

# The kernel shapes shipped for head_dim <= 128, measured best on an H200
# (docs/bench-tq-decode-h200.md): (largest B*Hk or None, shape), first match wins;
# a shape is DecodeConfig fields and the programs per SM it reaches uncapped and
# under the 168-register cap (the split count follows from them).
SHIPPED: list = [
    # below 64 (B < 8 at Hk = 8): 4 warps x 64-token tiles
    (63, {"base": {}, "occupancy": 2, "occupancy_capped": 3}),
    # larger batches: 1 warp x 16-token tiles, no cross-warp reductions or barriers
    (None, {"base": {"block_n": 16, "num_warps": 1}, "occupancy": 8, "occupancy_capped": 12}),
]


def default_config(head_dim: int, group: int = 8, batch_heads: int | None = None) -> DecodeConfig:
    """The measured-best config for a launch shape (batch_heads = B * Hk).

    H200, head_dim 128: the ``SHIPPED`` kernel shape for B*Hk; a 168-register
    cap (more programs per SM) when B*Hk lets the split count fill whole waves
    (64..256); at B*Hk < 64 (latency-bound) and > 256 (few splits) uncapped.
    Other head sizes: the first shape, smaller tiles for 256, untuned.
    """
    cfg = TUNED.get((head_dim, group))
    if cfg is not None:
        return cfg
    if head_dim > 128:
        return DecodeConfig(block_n=32)
    bh = batch_heads if batch_heads is not None else 1
    shape = next(v for lim, v in SHIPPED if lim is None or bh <= lim)
    if 64 <= bh <= 256:
        return DecodeConfig(**{**shape["base"], "maxnreg": 168, "occupancy": shape["occupancy_capped"]})
    return DecodeConfig(**{**shape["base"], "occupancy": shape["occupancy"]})


def pick_num_splits(batch: int, num_kv_heads: int, device: torch.device, cfg: DecodeConfig, max_splits: int) -> int:
    """Splits per sequence: a function of the launch shape only (graph-safe).

    "waves": about two full waves of programs (occupancy x SMs each), so no
    last wave runs a few programs alone; where max_splits caps that, the count
    whose last wave is fullest; short sequences use fewer splits
    (min_split_tokens), their idle programs exit at once.
    """
    if cfg.num_splits is not None:
        return max(1, min(cfg.num_splits, max_splits))
    bh = max(1, batch * num_kv_heads)
    if cfg.split_policy == "waves":
        slots = cfg.occupancy * _sm_count(device)
        want = (2 * slots) // bh
        if want <= max_splits:
            return max(1, want)
        # capped: the count whose last wave is fullest (ties: more splits)
        return max(range(1, max_splits + 1), key=lambda s: (bh * s / (-(-bh * s // slots) * slots), s))
    return max(1, min(max_splits, math.ceil(cfg.ctas_per_sm * _sm_count(device) / bh)))


def triton_decode_attention(
    query: torch.Tensor,  # [B, Hq, D] fp16/bf16
    kv_cache: torch.Tensor,  # [blocks, page, Hk, slot] uint8
    block_table: torch.Tensor,  # [B, max_blocks] int32
    seq_lens: torch.Tensor,  # [B] int32
    scale: float,
    *,
    out: torch.Tensor | None = None,  # [B, Hq, D] query dtype
    lse: torch.Tensor | None = None,  # [B, Hq] float32, natural log
    workspace: torch.Tensor | None = None,  # float32, >= workspace_numel(...)
    config: DecodeConfig | None = None,
    max_splits: int = 64,
) -> torch.Tensor:
    """Paged decode attention over a k8v4 cache on the Triton kernels. Returns ``out``.

    The Triton backend alone; ``dispatch.decode_attention`` chooses between it and the CUDA kernels.
    """
    bsz, hq, d = query.shape
    hk = kv_cache.shape[2]
    if hq % hk:
        raise ValueError(f"Hq={hq} is not a multiple of Hk={hk}")
    check_cache(kv_cache, d, hk)
    g = hq // hk
    cfg = config or default_config(d, g, bsz * hk)
    splits = pick_num_splits(bsz, hk, query.device, cfg, max_splits)
    min_tiles = max(1, math.ceil(cfg.min_split_tokens / cfg.block_n))

    need = workspace_numel(bsz, hq, d, splits)
    if workspace is None or workspace.numel() < need or workspace.dtype != torch.float32 or not workspace.is_contiguous():
        workspace = torch.empty(need, dtype=torch.float32, device=query.device)
    flat = workspace.view(-1)
    mid_o = flat[: bsz * hq * splits * d]
    mid_l = flat[bsz * hq * splits * d : need]
    if out is None:
        out = torch.empty(bsz, hq, d, dtype=query.dtype, device=query.device)
    if bsz == 0:
        return out

    kv32 = kv_cache.view(torch.int32)
    _decode_split_kernel[(bsz, hk, splits)](
        query, kv_cache, kv32, block_table, seq_lens, mid_o, mid_l,
        scale * LOG2E, splits, min_tiles,
        query.stride(0), query.stride(1), block_table.stride(0),
        HQ=hq, G=g, BLOCK_H=max(16, triton.next_power_of_2(g)), D=d,
        PAGE=kv_cache.shape[1], BLOCK_N=cfg.block_n,
        STRIDE_BLK=kv_cache.stride(0), STRIDE_POS=kv_cache.stride(1), STRIDE_HEAD=kv_cache.stride(2),
        ASM_UNPACK=cfg.asm_unpack and not interpreting(), PREFETCH=cfg.prefetch,
        WORDS=cfg.words and not interpreting(),
        OPAQUE=cfg.opaque and cfg.words and not interpreting(), LAZY=cfg.lazy, TAU=float(cfg.tau),
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        **({"maxnreg": cfg.maxnreg} if cfg.maxnreg and not interpreting() else {}),
    )
    _merge_kernel[(bsz, hq)](
        mid_o, mid_l, seq_lens, out, lse if lse is not None else mid_l,
        splits, min_tiles,
        out.stride(0), out.stride(1), lse.stride(0) if lse is not None else 0,
        HQ=hq, D=d, BLOCK_N=cfg.block_n, BLOCK_S=max(2, triton.next_power_of_2(splits)),
        WRITE_LSE=lse is not None,
        num_warps=4 if d >= 128 else 2,
    )
    return out
