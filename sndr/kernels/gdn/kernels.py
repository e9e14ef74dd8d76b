"""Triton kernel for the gated delta-rule (GDN) decode and spec-verify step.

One launch updates every sequence's recurrent state in place and writes the
outputs of all its tokens. The gating is fused: the kernel reads the raw
``a``, ``b`` (per token and value head), ``A_log`` and ``dt_bias`` and
computes ``g = -exp(A_log) * softplus(a + dt_bias)`` and
``beta = sigmoid(b)`` itself; ``q`` and ``k`` are L2-normalised in the
kernel. Accumulation is float32; the state pool is float32 or bfloat16.

Grid ``N * HV * V / BV`` (V blocks fastest): one program per (sequence,
value head, block of BV value rows). A program holds its ``[BV, K]`` slice of the state in
registers for all T tokens of the sequence, so the state is read once and
written once per token (T = 1: once). Splitting V across programs is what
fills the GPU at batch 1-32 (32 value heads x 1 sequence is 32 tiles, a
quarter of an H200's multiprocessors; with BV = 8 it is 512 programs). The
recurrence per token is rearranged so that both reductions over K read the
decayed-before state directly and run side by side::

    hk = decay * (S k)        hq = decay * (S q)
    u  = beta * (v - hk)      o  = hq + u * (k . q)
    S  = decay * S + u k^T

(equal to the textbook order in exact arithmetic; one pass over the tile
for the reductions, one for the update). Token t + 1's q, k, v, a, b are
loaded before token t computes, so their latency hides behind its work.

State addressing is vLLM 0.32.0's: the pool is ``[slots, HV, V, K]`` with
any slot stride and contiguous ``[HV, V, K]`` rows; the initial state of
sequence ``n`` is slot ``idx[n, num_accepted[n] - 1]`` (column 0 without
``num_accepted``), and the state after token ``t`` is written to slot
``idx[n, t]``. Slots <= 0 are padding (vLLM's NULL_BLOCK_ID is 0, the
metadata pads with -1): such a sequence reads and writes no state and its
outputs are zero. With ``cu_seqlens`` each sequence has its own token count;
without, every sequence has ``T``.

With an output gate (``FUSE_NORM``) the step also applies vLLM's gated RMSNorm
(norm before gate, group = V) to its outputs, in the same launch: each program
stores its rows of the output (rounded to the output dtype, as vLLM's unfused
path stores them before its norm) and their sum of squares; the last of a
head's programs to finish (an arrival counter per sequence and head) reads the
head's rows back and writes them normalised and gated. A program that holds the
whole head (BV >= V) normalises its outputs in registers, token by token.

The launch never synchronises with the host and allocates nothing but the
fused norm's workspace, once per device and stream (``norm_workspace``):
CUDA-graph capturable.
``make_plan`` fixes everything of a launch but the tensors; ``run_plan``
launches it, directly through the compiled kernel once a plan has compiled
(``FAST_LAUNCH``), which keeps an eager call's Python cost low.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch
import triton
import triton.language as tl

from .. import _cudart


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


@triton.jit
def _norm_head_rows(o, s_o_tok, s_o_head, z, s_z_tok, s_z_head, ws, norm_w, bos, n_tok, i_hv, norm_eps,
                    HV: tl.constexpr, V: tl.constexpr, BV: tl.constexpr, NV: tl.constexpr, NVP: tl.constexpr,
                    TP: tl.constexpr, SIGMOID_GATE: tl.constexpr):
    """The gated RMSNorm of one (request, value head)'s rows of every token, in place in ``o``, by the last of
    the head's NV programs to arrive (the step's and the replayed step's kernels): each token's sum of squares
    from the programs' partial sums in ``ws`` ([tokens, HV, NVP]), TP tokens at a time (one round of loads, not
    one per token); needs NVP * BV >= V."""
    o_all = tl.arange(0, NVP * BV)
    m_all = o_all < V
    o_p = tl.arange(0, NVP)
    o_t = tl.arange(0, TP)
    b_w = tl.load(norm_w + o_all, mask=m_all, other=0).to(tl.float32)
    for t0 in range(0, n_tok, TP):
        rows = bos + t0 + o_t
        m_t = (t0 + o_t) < n_tok
        parts = tl.load(ws + (rows[:, None] * HV + i_hv) * NVP + o_p[None, :],
                        mask=m_t[:, None] & (o_p < NV)[None, :], other=0, cache_modifier=".cg")
        rstd = 1.0 / tl.sqrt(tl.sum(parts, 1) / V + norm_eps)
        m2 = m_t[:, None] & m_all[None, :]
        p_rows = o + rows[:, None] * s_o_tok + i_hv * s_o_head + o_all[None, :]
        x = tl.load(p_rows, mask=m2, other=0, cache_modifier=".cg").to(tl.float32)
        b_z = tl.load(z + rows[:, None] * s_z_tok + i_hv * s_z_head + o_all[None, :], mask=m2,
                      other=0).to(tl.float32)
        if SIGMOID_GATE:
            gate = tl.sigmoid(b_z)
        else:
            gate = b_z * tl.sigmoid(b_z)
        tl.store(p_rows, (x * rstd[:, None] * b_w[None, :] * gate).to(o.dtype.element_ty), mask=m2)


@triton.jit(do_not_specialize=["sp_beta", "sp_threshold", "scale", "norm_eps"])
def _gdn_step_kernel(
    q, k, v, a, b, A_log, dt_bias, o, state, indices, num_accepted, cu_seqlens, z, norm_w, ws, counter,
    scale, sp_beta, sp_threshold, T,
    s_q_tok, s_q_head, s_k_tok, s_k_head, s_v_tok, s_v_head,
    s_a_tok, s_b_tok, s_o_tok, s_o_head,
    s_state_slot, s_idx_seq, s_idx_tok, s_z_tok, s_z_head, norm_eps,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr,
    IS_VARLEN: tl.constexpr, IS_SPEC: tl.constexpr, L2NORM: tl.constexpr,
    ZERO_PADDED_OUT: tl.constexpr, PACKED: tl.constexpr,
    FUSE_NORM: tl.constexpr, SIGMOID_GATE: tl.constexpr, STRICT_ACC: tl.constexpr, NVP: tl.constexpr,
    TP: tl.constexpr, PREFETCH: tl.constexpr, STREAM: tl.constexpr,
):
    # 1-D grid, V blocks fastest: neighbouring programs stream neighbouring rows of one state
    NV: tl.constexpr = (V + BV - 1) // BV
    pid = tl.program_id(0)
    i_v = pid % NV
    i_nh = pid // NV
    i_n = i_nh // HV
    i_hv = i_nh % HV
    i_h = i_hv // (HV // H)

    if IS_VARLEN:
        bos = tl.load(cu_seqlens + i_n).to(tl.int64)
        eos = tl.load(cu_seqlens + i_n + 1).to(tl.int64)
        n_tok = eos - bos
    elif PACKED:  # one token per sequence, known at compile time: the token loop unrolls
        bos = i_n.to(tl.int64)
        n_tok = 1
    else:
        bos = i_n.to(tl.int64) * T
        n_tok = T
    if n_tok <= 0:
        return

    p_idx = indices + i_n.to(tl.int64) * s_idx_seq
    if IS_SPEC:
        if STRICT_ACC:  # vLLM's fused MTP op: no initial state unless 1 <= accepted <= T (index columns)
            acc = tl.load(num_accepted + i_n).to(tl.int64)
            slot0 = tl.load(p_idx + (acc - 1) * s_idx_tok, mask=(acc >= 1) & (acc <= T), other=0).to(tl.int64)
        else:
            i0 = tl.maximum(tl.load(num_accepted + i_n).to(tl.int64) - 1, 0)
            slot0 = tl.load(p_idx + i0 * s_idx_tok).to(tl.int64)
    else:
        slot0 = tl.load(p_idx).to(tl.int64)

    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    mask_k = o_k < K
    mask_v = o_v < V
    p_o = o + bos * s_o_tok + i_hv * s_o_head + o_v

    if slot0 <= 0:
        if ZERO_PADDED_OUT:
            zero = tl.zeros([BV], dtype=tl.float32).to(o.dtype.element_ty)
            for t in range(n_tok):
                tl.store(p_o + t * s_o_tok, zero, mask=mask_v)
        return

    tile = i_hv * (V * K) + o_v[:, None] * K + o_k[None, :]
    # STREAM: the state is read once and its snapshots are read by nobody in this step: evict-first
    # loads and streaming stores leave L2 to the activations and the norm's hand-off
    EVICT: tl.constexpr = "evict_first" if STREAM else ""
    ST_CM: tl.constexpr = ".cs" if STREAM else ""
    if BK == K and BV * (V // BV) == V:
        b_h = tl.load(state + slot0 * s_state_slot + tile, eviction_policy=EVICT).to(tl.float32)
    else:
        mask_h = mask_v[:, None] & mask_k[None, :]
        b_h = tl.load(state + slot0 * s_state_slot + tile, mask=mask_h, other=0, eviction_policy=EVICT).to(tl.float32)

    neg_A = -tl.exp(tl.load(A_log + i_hv).to(tl.float32))
    b_dt = tl.load(dt_bias + i_hv).to(tl.float32)

    p_q = q + bos * s_q_tok + i_h * s_q_head + o_k
    if PACKED:  # one [tokens, 2 H K + HV V] tensor: q | k | v
        p_k = q + bos * s_q_tok + H * K + i_h * K + o_k
        p_v = q + bos * s_q_tok + 2 * H * K + i_hv * V + o_v
    else:
        p_k = k + bos * s_k_tok + i_h * s_k_head + o_k
        p_v = v + bos * s_v_tok + i_hv * s_v_head + o_v
    p_a = a + bos * s_a_tok + i_hv
    p_b = b + bos * s_b_tok + i_hv

    # one program per head (NV == 1): the gated RMSNorm stays in the program, token by token.
    # (Keeping the first TP tokens' outputs in registers and normalising them after the token
    # loop measured 50% slower at T = 1 on the H200, bf16 batch 64-256, 128 x 8.)
    HEAD_NORM: tl.constexpr = FUSE_NORM and NV == 1
    if HEAD_NORM:
        p_z = z + bos * s_z_tok + i_hv * s_z_head + o_v
        b_w = tl.load(norm_w + o_v, mask=mask_v, other=0).to(tl.float32)

    # token 0's inputs; each iteration then loads the next token's before it computes
    b_q = tl.load(p_q, mask=mask_k, other=0).to(tl.float32)
    b_k = tl.load(p_k, mask=mask_k, other=0).to(tl.float32)
    b_v = tl.load(p_v, mask=mask_v, other=0).to(tl.float32)
    b_x = tl.load(p_a).to(tl.float32)
    b_b = tl.load(p_b).to(tl.float32)

    slot_last = slot0
    for t in range(n_tok):
        if PACKED and not IS_VARLEN:  # the one token's snapshot slot is slot0; there is no next token
            slot_t = slot0
            n_q, n_k, n_v, n_x, n_b = b_q, b_k, b_v, b_x, b_b
        elif not PREFETCH:  # this token's inputs now (token 0's are loaded above): fewer live registers
            if IS_SPEC:
                slot_t = tl.load(p_idx + t * s_idx_tok).to(tl.int64)
            else:
                slot_t = tl.where(t == 0, slot0, tl.load(p_idx + t * s_idx_tok, mask=t > 0, other=0).to(tl.int64))
            if t > 0:
                b_q = tl.load(p_q + t * s_q_tok, mask=mask_k, other=0).to(tl.float32)
                b_k = tl.load(p_k + t * s_k_tok, mask=mask_k, other=0).to(tl.float32)
                b_v = tl.load(p_v + t * s_v_tok, mask=mask_v, other=0).to(tl.float32)
                b_x = tl.load(p_a + t * s_a_tok).to(tl.float32)
                b_b = tl.load(p_b + t * s_b_tok).to(tl.float32)
            n_q, n_k, n_v, n_x, n_b = b_q, b_k, b_v, b_x, b_b
        else:
            if IS_SPEC:
                slot_t = tl.load(p_idx + t * s_idx_tok).to(tl.int64)
            else:  # column 0 is slot0, already loaded
                slot_t = tl.where(t == 0, slot0, tl.load(p_idx + t * s_idx_tok, mask=t > 0, other=0).to(tl.int64))
            # the next token's inputs, masked off after the last token. (Loading the last
            # token again instead, unmasked, measured 11% slower at batch 8, T = 2 and 4.)
            nxt = t + 1
            has_next = nxt < n_tok
            n_q = tl.load(p_q + nxt * s_q_tok, mask=mask_k & has_next, other=0).to(tl.float32)
            n_k = tl.load(p_k + nxt * s_k_tok, mask=mask_k & has_next, other=0).to(tl.float32)
            n_v = tl.load(p_v + nxt * s_v_tok, mask=mask_v & has_next, other=0).to(tl.float32)
            n_x = tl.load(p_a + nxt * s_a_tok, mask=has_next, other=0).to(tl.float32)
            n_b = tl.load(p_b + nxt * s_b_tok, mask=has_next, other=0).to(tl.float32)

        x = b_x + b_dt
        bx = sp_beta * x
        sp = tl.where(bx <= sp_threshold, tl.log(1.0 + tl.exp(bx)) / sp_beta, x)
        decay = tl.exp(neg_A * sp)
        beta = tl.sigmoid(b_b)
        if L2NORM:
            b_q = b_q / tl.sqrt(tl.sum(b_q * b_q) + 1e-6)
            b_k = b_k / tl.sqrt(tl.sum(b_k * b_k) + 1e-6)
        b_q = b_q * scale
        kq = tl.sum(b_k * b_q)

        hk = tl.sum(b_h * b_k[None, :], 1) * decay
        hq = tl.sum(b_h * b_q[None, :], 1) * decay
        u = (b_v - hk) * beta
        b_o = hq + u * kq
        b_h = b_h * decay + u[:, None] * b_k[None, :]
        b_o = b_o.to(o.dtype.element_ty)
        if HEAD_NORM:  # the whole head's rows are here: norm and gate now, no second pass
            b_z = tl.load(p_z + t * s_z_tok, mask=mask_v, other=0).to(tl.float32)
            b_of = b_o.to(tl.float32)  # the rounded output, as vLLM's unfused path stores it before its norm
            rstd = 1.0 / tl.sqrt(tl.sum(b_of * b_of) / V + norm_eps)
            if SIGMOID_GATE:
                gate = tl.sigmoid(b_z)
            else:
                gate = b_z * tl.sigmoid(b_z)
            tl.store(p_o + t * s_o_tok, (b_of * rstd * b_w * gate).to(o.dtype.element_ty), mask=mask_v)
        else:
            tl.store(p_o + t * s_o_tok, b_o, mask=mask_v)
        if FUSE_NORM and not HEAD_NORM:  # this program's part of the token's sum of squares (of the rounded output)
            b_of = b_o.to(tl.float32)
            tl.store(ws + ((bos + t) * HV + i_hv) * NVP + i_v, tl.sum(b_of * b_of))
        if FUSE_NORM and not HEAD_NORM:  # the last token's state is stored after the norm's release (below)
            store_now = (slot_t > 0) & (t + 1 < n_tok)
        else:
            store_now = slot_t > 0
        if store_now:
            p_ht = state + slot_t * s_state_slot + tile
            if BK == K and BV * (V // BV) == V:
                tl.store(p_ht, b_h.to(state.dtype.element_ty), cache_modifier=ST_CM)
            else:
                tl.store(p_ht, b_h.to(state.dtype.element_ty), mask=mask_v[:, None] & mask_k[None, :],
                         cache_modifier=ST_CM)
        slot_last = slot_t

        b_q, b_k, b_v, b_x, b_b = n_q, n_k, n_v, n_x, n_b

    if FUSE_NORM and not HEAD_NORM:  # (needs NVP * BV >= V: NVP is the programs per head rounded up to a power of 2)
        # The gated RMSNorm needs the whole head's V outputs, which NV programs wrote. The
        # last of them to arrive (a per-head counter; acq_rel orders every program's output
        # and partial sums before its increment) normalises the head's rows of every token
        # in place and resets the counter for the next launch.
        tl.debug_barrier()  # every thread's stores before the (one-thread) release, as CUTLASS's semaphore
        arrived = tl.atomic_add(counter + i_n.to(tl.int64) * HV + i_hv, 1, sem="acq_rel")
        # The last token's state store is issued only now: the release above waits for this
        # program's outstanding stores, and the state (read by nobody here) need not be among them.
        # (Storing every snapshot after the release instead, re-evolved from the initial state and
        # each token's u_t, measured 5-70% slower on the H200 in every swept cell.)
        if slot_last > 0:
            p_hl = state + slot_last * s_state_slot + tile
            if BK == K and BV * (V // BV) == V:
                tl.store(p_hl, b_h.to(state.dtype.element_ty), cache_modifier=ST_CM)
            else:
                tl.store(p_hl, b_h.to(state.dtype.element_ty), mask=mask_v[:, None] & mask_k[None, :],
                         cache_modifier=ST_CM)
        if arrived == NV - 1:
            _norm_head_rows(o, s_o_tok, s_o_head, z, s_z_tok, s_z_head, ws, norm_w, bos, n_tok, i_hv, norm_eps,
                            HV, V, BV, NV, NVP, TP, SIGMOID_GATE)
            tl.atomic_xchg(counter + i_n.to(tl.int64) * HV + i_hv, 0, sem="relaxed")


@dataclass(frozen=True)
class StepConfig:
    """Launch shape: value rows per program and warps per program; ``prefetch``: each token loads the
    next token's inputs before it computes; ``stream``: evict-first state loads, streaming snapshot stores;
    ``maxnreg``: a register cap per thread for ptxas (0: none), which buys occupancy with a few spills."""

    block_v: int
    num_warps: int
    prefetch: bool = True
    stream: bool = False
    maxnreg: int = 0


def pick_config(n_seqs: int, hv: int, v: int, k: int, device: torch.device,
                state_dtype: torch.dtype | None = None, fused_norm: bool = False, tokens: int = 1) -> StepConfig:
    """BV and warps from the number of (sequence, value head) tiles (and, with the fused norm, T).

    One warp per program (on an H200 it beat 2-8 warps in every swept cell;
    the per-row reductions then stay inside the warp). Up to 64 tiles
    (batch <= 2 at HV = 32) BV = 8, so that N * HV * V / BV programs cover
    the multiprocessors several times over (batch 1: 512 programs); beyond,
    BV = 16 (64 state values per thread at K = 128). Swept on an H200, fp32
    state, K = V = 128, batch 1-256, T 1 and 4 (docs/bench-gdn-h200.md): the
    best shape or within 2% of it except batch 1 / T = 1 (8x2 0.7 µs
    faster).

    The fused-norm step is occupancy-bound (ncu on the H200: 218 registers per
    thread at BV = 32 with a bf16 pool, 12.5% theoretical occupancy, against 50%
    for vLLM's CUDA op; the same DRAM bytes). Beyond 64 tiles with T >= 2 it
    takes BV = 16 with ptxas capped at 128 registers per thread (168 uncapped:
    12 -> 16 warps per multiprocessor, no spills at fp32, a few bytes at bf16),
    ``bench_gdn.py --norm-sweep`` on the H200, graph replay, batch 8-256, T 2
    and 4: the best shape in 12 of 14 cells (the other two within 1%), up to 9%
    faster than the previous picks (fp32: BV = 8 at batch 8, 16 beyond; bf16:
    BV = 32); caps of 112 at BV = 16 and of 128-168 at BV = 32 were slower
    (spills). T = 1 keeps BV = 16 uncapped (caps of 96-112 were 1-7% slower).
    """
    tiles = n_seqs * hv
    vp = triton.next_power_of_2(v)
    kp = triton.next_power_of_2(k)
    bv = 8 if tiles <= 64 else 16
    maxnreg = 0
    if fused_norm and tiles > 64 and tokens >= 2 and vp == 128 and kp == 128:
        maxnreg = 128  # (measured at K = V = 128 only)
    bv = min(bv, vp)
    warps = 1
    # at most 128 state values per thread for wide K
    while bv * kp > 128 * 32 * warps and warps < 8:
        warps *= 2
    return StepConfig(bv, warps, maxnreg=maxnreg)


_CONST_NAMES = ("H", "HV", "K", "V", "BK", "BV", "IS_VARLEN", "IS_SPEC", "L2NORM", "ZERO_PADDED_OUT", "PACKED",
                "FUSE_NORM", "SIGMOID_GATE", "STRICT_ACC", "NVP", "TP", "PREFETCH", "STREAM")


@dataclass(frozen=True)
class Plan:
    """Everything of a launch but the tensors: fixed per (shapes, strides, dtypes, flags)."""

    grid: tuple[int, int]
    ints: tuple  # scale, sp_beta, sp_threshold, T, the 15 strides and norm_eps (signature order)
    consts: tuple  # values of _CONST_NAMES
    num_warps: int
    packed: bool
    norm_parts: int = 0  # fused norm: partial sums per (token, value head) in the workspace; 0 without
    maxnreg: int = 0  # ptxas register cap per thread (0: none)


def make_plan(
    q, k, v, a, b, out, state, ssm_state_indices, *, scale: float, n_seqs: int, tokens_per_seq: int = 1,
    varlen: bool = False, spec: bool = False, l2norm: bool = True, sp_beta: float = 1.0,
    sp_threshold: float = 20.0, zero_padded_out: bool = True, idx_tok_stride: int | None = None,
    config: StepConfig | None = None, gate=None, norm_eps: float = 1e-6, sigmoid_gate: bool = False,
    strict_accepted: bool = False,
) -> Plan:
    """``gate`` (the output gate, [tokens, HV, V] strides) fuses the gated RMSNorm: the
    launch then needs ``z`` and ``norm_w`` in ``run_plan``; ``out`` must be [tokens, HV, V]."""
    HV, V, K = state.shape[1], state.shape[2], state.shape[3]
    packed = k is None
    if packed:
        H = (q.shape[1] - HV * V) // (2 * K)
        sq = (q.stride(0), K)
        sk = sv = sq
    else:
        H = k.shape[1]
        sq, sk, sv = q.stride()[:2], k.stride()[:2], v.stride()[:2]
    fuse = gate is not None
    cfg = config or pick_config(n_seqs, HV, V, K, state.device, state_dtype=state.dtype, fused_norm=fuse,
                                tokens=1 if packed and not varlen else max(int(tokens_per_seq), 1))
    BK = triton.next_power_of_2(K)
    BV = min(cfg.block_v, triton.next_power_of_2(V))
    sz = (gate.stride(0), gate.stride(1)) if fuse else (0, 0)
    idx = ssm_state_indices
    if idx_tok_stride is None:
        idx_tok_stride = idx.stride(1) if idx.dim() == 2 else 1
    ints = (float(scale), float(sp_beta), float(sp_threshold), int(tokens_per_seq),
            sq[0], sq[1], sk[0], sk[1], sv[0], sv[1], a.stride(0), b.stride(0), out.stride(0), out.stride(1),
            state.stride(0), idx.stride(0), idx_tok_stride, sz[0], sz[1], float(norm_eps))
    nvp = triton.next_power_of_2(triton.cdiv(V, BV))
    consts = (H, HV, K, V, BK, BV, bool(varlen), bool(spec), bool(l2norm), bool(zero_padded_out), packed,
              fuse, bool(sigmoid_gate), bool(strict_accepted), nvp,
              # the fused norm's chunk of tokens: one token (packed decode) or the index columns / T
              1 if (packed and not varlen) or not fuse else min(triton.next_power_of_2(max(int(tokens_per_seq), 1)), 8),
              bool(cfg.prefetch), bool(cfg.stream))
    # one program per head (BV >= V) normalises in the program: no workspace
    return Plan((n_seqs * HV * triton.cdiv(V, BV), 1), ints, consts, cfg.num_warps, packed,
                nvp if fuse and BV < V else 0, int(cfg.maxnreg))


# Launches bypass JITFunction.run's binder once a plan has compiled: the
# CompiledKernel Triton returned is kept per (plan, device, pointer
# alignments) and launched directly (Triton 3.x CompiledKernel.run), which
# cuts the Python cost of an eager call. The plan fixes every int argument,
# so the only specialisation left is the 16-byte alignment of the pointers.
FAST_LAUNCH = True
# Triton's CompiledKernel: its launcher attributes (run, function, packed_metadata) vary by version.
_COMPILED: dict[tuple, Any] = {}
STATS = {"fast": 0, "jit": 0}


def _no_hook(h) -> bool:
    # Triton 3.6: an empty knobs.HookChain; older: None
    return h is None or (isinstance(getattr(h, "calls", None), list) and not h.calls)


# "rt": triton.knobs.runtime (its type varies by Triton version), or False where there is none.
_KNOBS: dict[str, Any] = {}


def _hooks_off() -> bool:
    """No launch hooks installed (profilers add some): the direct launch may pass None for them."""
    rt: Any = _KNOBS.get("rt")
    if rt is None:
        try:
            from triton import knobs

            rt = _KNOBS["rt"] = knobs.runtime
        except Exception:  # noqa: BLE001 - another Triton: no fast path
            rt = _KNOBS["rt"] = False
    return rt is not False and _no_hook(rt.launch_enter_hook) and _no_hook(rt.launch_exit_hook)


def run_plan(plan: Plan, q, k, v, a, b, A_log, dt_bias, out, state, idx, num_accepted=None, cu_seqlens=None,
             cache_key=None, z=None, norm_w=None) -> None:
    """Launch ``plan`` on these tensors (``cache_key``: a hashable plan identity enabling the fast path).

    ``z`` / ``norm_w``: the output gate and the norm weight of a fused-norm plan (its
    workspace comes from :func:`norm_workspace`)."""
    if plan.grid[0] == 0:
        return
    if plan.packed:
        k = v = q
    na = num_accepted if num_accepted is not None else idx
    cu = cu_seqlens if cu_seqlens is not None else idx
    if plan.norm_parts:
        ws, cnt = norm_workspace(out.device, out.shape[0] * out.shape[1] * plan.norm_parts, plan.grid[0])
    else:
        ws = cnt = A_log
    tensors = (q, k, v, a, b, A_log, dt_bias, out, state, idx, na, cu,
               z if z is not None else q, norm_w if norm_w is not None else A_log, ws, cnt)
    fast = FAST_LAUNCH and cache_key is not None and state.device.type == "cuda"
    if fast:
        dev = _driver().get_current_device()
        key = (cache_key, dev, tuple(t.data_ptr() % 16 == 0 for t in tensors))
        ck = _COMPILED.get(key)
        if ck is not None and _hooks_off():
            stream = _driver().get_current_stream(dev)
            ck.run(plan.grid[0], plan.grid[1], 1, stream, ck.function, ck.packed_metadata, None, None, None,
                   *tensors, *plan.ints, *plan.consts)
            STATS["fast"] += 1
            return
    opts = {"maxnreg": plan.maxnreg} if plan.maxnreg and not interpreting() else {}
    compiled = _gdn_step_kernel[plan.grid](
        *tensors, *plan.ints, **dict(zip(_CONST_NAMES, plan.consts)), num_warps=plan.num_warps, num_stages=1, **opts)
    STATS["jit"] += 1
    if fast and compiled is not None and hasattr(compiled, "packed_metadata") and _hooks_off():
        _COMPILED[key] = compiled


# Fused-norm workspaces per (device, stream): float32 partial sums of squares and int32
# per-head arrival counters (zero between launches: the last program of a head resets its
# counter). A launch captured in a CUDA graph keeps the pointers it was captured with, so a
# workspace is never freed once handed out: growing allocates a larger one and keeps the old.
_WORKSPACES: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}
_RETIRED: list[tuple[torch.Tensor, torch.Tensor]] = []


def norm_workspace(device: torch.device, n_parts: int, n_counters: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(partial sums >= n_parts floats, counters >= n_counters zeroed int32) for this device and stream."""
    if device.type == "cuda":
        key: tuple = (_cudart.device_index(device),
                      torch.cuda.current_stream(device).cuda_stream)
    else:
        key = (device.type, 0)
    cur = _WORKSPACES.get(key)
    if cur is None or cur[0].numel() < n_parts or cur[1].numel() < n_counters:
        if cur is not None:
            _RETIRED.append(cur)
        size_p = max(n_parts, 1 << 16, 2 * cur[0].numel() if cur is not None else 0)
        size_c = max(n_counters, 1 << 14, 2 * cur[1].numel() if cur is not None else 0)
        cur = (torch.empty(size_p, dtype=torch.float32, device=device),
               torch.zeros(size_c, dtype=torch.int32, device=device))
        _WORKSPACES[key] = cur
    return cur


_DRIVER: dict[str, object] = {}


def _driver():
    d = _DRIVER.get("d")
    if d is None:
        from triton.runtime import driver

        d = _DRIVER["d"] = driver.active
    return d


def gdn_step(
    q: torch.Tensor,          # [tokens, H, K] (any token / head strides, last dim contiguous)
    k: torch.Tensor | None,   # [tokens, H, K]; None: ``q`` is vLLM's packed [tokens, 2 H K + HV V]
    v: torch.Tensor | None,   # [tokens, HV, V]; None with k
    a: torch.Tensor,          # [tokens, HV] (last dim contiguous)
    b: torch.Tensor,          # [tokens, HV]
    A_log: torch.Tensor,      # [HV] contiguous
    dt_bias: torch.Tensor,    # [HV] contiguous
    state: torch.Tensor,      # [slots, HV, V, K], rows contiguous, any slot stride
    ssm_state_indices: torch.Tensor,  # [N] or [N, T_max]
    out: torch.Tensor,        # [tokens, HV, V] (last dim contiguous)
    *,
    scale: float,
    n_seqs: int,
    tokens_per_seq: int = 1,  # T when cu_seqlens is None
    cu_seqlens: torch.Tensor | None = None,
    num_accepted_tokens: torch.Tensor | None = None,
    l2norm: bool = True,
    sp_beta: float = 1.0,
    sp_threshold: float = 20.0,
    zero_padded_out: bool = True,
    idx_tok_stride: int | None = None,
    config: StepConfig | None = None,
    output_gate: torch.Tensor | None = None,  # [tokens, HV, V] (last dim contiguous): fuse the gated RMSNorm
    norm_weight: torch.Tensor | None = None,  # [V] contiguous
    norm_eps: float = 1e-6,
    gate_activation: str = "silu",  # or "sigmoid"
    strict_accepted: bool = False,
) -> torch.Tensor:
    """Launch the fused step; returns ``out``. No argument checks: see ``vllm_entry``.

    Packed (``k is None``): ``q`` is [tokens, 2 H K + HV V] with its last dim
    contiguous; H, K, HV, V come from ``state`` and the packed width.

    With ``output_gate`` the output is vLLM's gated RMSNorm of the step's
    output (norm before gate): ``o * rsqrt(mean(o^2) + eps) * w * act(z)``,
    per token and value head, computed from the float32 ``o``.
    ``strict_accepted``: vLLM's fused MTP op's rule, a sequence whose
    ``num_accepted_tokens`` is outside [1, index columns] has no state.
    """
    plan = make_plan(q, k, v, a, b, out, state, ssm_state_indices, scale=scale, n_seqs=n_seqs,
                     tokens_per_seq=tokens_per_seq, varlen=cu_seqlens is not None,
                     spec=num_accepted_tokens is not None, l2norm=l2norm, sp_beta=sp_beta,
                     sp_threshold=sp_threshold, zero_padded_out=zero_padded_out, idx_tok_stride=idx_tok_stride,
                     config=config, gate=output_gate, norm_eps=norm_eps, sigmoid_gate=gate_activation == "sigmoid",
                     strict_accepted=strict_accepted)
    run_plan(plan, q, k, v, a, b, A_log, dt_bias, out, state, ssm_state_indices, num_accepted_tokens, cu_seqlens,
             z=output_gate, norm_w=norm_weight)
    return out
