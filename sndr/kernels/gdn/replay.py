"""Replayed spec verify for the GDN layer: one state read and one state write per step, whatever T is.

EXPERIMENTAL, default off: routed into vLLM's Qwen GDN layer by patch PK0004
(``sndr/kernels/gdn/vllm_replay.py``; docs/gdn-replay.md says where it applies and why it is off). vLLM 0.32.0's spec verify (``fused_gdn_decode_post_conv_mtp``) writes a full
recurrent-state snapshot after every one of a request's T verify tokens, because it does not
yet know how many will be accepted; the next step reads the snapshot of column
``num_accepted_tokens - 1``. Its traffic is one state read + T state writes per step.

Here a step writes the state once, and keeps the step's per-token inputs of the recurrence
(the L2-normalised ``k`` in float32, ``v`` as given, the decay ``exp(g)`` and ``beta`` in
float32: about (H K + HV V + 2 HV) values per token) in a side buffer. The next step replays
the accepted tokens onto the saved state, in registers, before its own tokens::

    step s   : base_s in slot idx[n, 0]; side[idx[n, 0]] = inputs of the step's T tokens
    step s+1 : S = base_s; replay the first num_accepted_tokens[n] tokens of side onto S
               (vLLM's snapshot of column num_accepted - 1, the same float32 arithmetic);
               round S to the pool dtype (as vLLM's snapshot store does);
               base_{s+1} = S  -> slot idx[n, 0] (the one state write);
               run the new tokens from S: outputs and the fused gated RMSNorm, no snapshots;
               side[idx[n, 0]] = this step's inputs.

A request's first spec step finds no side entry (``pending`` 0) and reads vLLM's own snapshot
slot ``idx[n, num_accepted - 1]`` (with the CUDA op's rule: no state unless
1 <= num_accepted <= columns), so it picks up where a prefill or a snapshot step left off.

The side buffer is keyed by the request's column-0 slot, double-buffered: per (slot, value
head) a ``meta`` row ``[parity, pending, column slots...]``. Programs read the half
``parity`` and write the other; the last program of a (request, value head) to arrive (the
same arrival counter that releases the fused norm) flips the parity, sets ``pending`` to the
step's token count and records the step's column slots. A key head's ``k`` is written by the
first value head of its group; all value heads of a request flip together, so they agree on
the parity.

Leaving replay: :meth:`GdnReplay.materialize` replays every pending token of the given slots
and writes each snapshot to the column slot it would have had in vLLM's step (so whatever
vLLM path runs next finds exactly the memory its snapshot path would have left), then clears
``pending``; :meth:`GdnReplay.invalidate` clears ``pending`` without writing (a slot whose
owner changed: a new request's prefill, ``has_initial_state`` false).

Backends: on a GPU the CUDA kernels of ``replay.cu`` (NVRTC, via ``sndr/kernels/_cudart.py``):
a block per (request, value head), each thread holding R rows x K / P columns of the state in
registers, so the sums over K are thread-local; a replayed token and its own pass are the same
function with explicit round-to-nearest operations, so the replayed state is bit for bit the
state the step's outputs came from (GPU tests). On the CPU (Triton interpreter) the Triton
kernels below, which the Hypothesis proofs run, bit for bit against PK0003's snapshot kernel.
"""

from __future__ import annotations

import ctypes
import logging
from dataclasses import dataclass
from pathlib import Path

import torch
import triton
import triton.language as tl

from .. import _cudart
from . import kernels as _k

LOG = logging.getLogger("sndr.kernels")
#: The CUDA kernel (NVRTC): the GPU backend of :class:`GdnReplay`; the Triton kernels below
#: are the CPU-interpreter backend (the Hypothesis proofs) and the GPU fallback.
CUDA_SOURCE = Path(__file__).with_name("replay.cu")
_KIND = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}
_LOGGED: set[str] = set()

#: The reason codes (registered in sndr/errors.py CODES) for each case the replayed step
#: does not take; the caller then keeps (or returns to) vLLM's snapshot path.
FALLBACKS: dict[str, str] = {
    "gdn_replay_prefix_caching": "mamba_cache_mode 'align' copies snapshot blocks between steps outside the layer",
    "gdn_replay_mixed_batch": "prefills or plain decodes in the batch: vLLM's _forward_core reads snapshots",
    "gdn_replay_kv_transfer": "a KV connector or state offload reads snapshot slots outside the layer",
    "gdn_replay_unsupported": "state dtype, layout, head ratio, device or token count outside the kernel's set",
}


@triton.jit
def _program(H: tl.constexpr, HV: tl.constexpr, V: tl.constexpr, BV: tl.constexpr):
    """This program's (V block, row, value head, key head) in a grid of rows x HV x V / BV (a row: a
    request of the step, a listed slot of materialize)."""
    pid = tl.program_id(0)
    i_v = pid % (V // BV)
    i_nh = pid // (V // BV)
    i_hv = i_nh % HV
    return i_v, i_nh // HV, i_hv, i_hv // (HV // H)


@triton.jit
def _side_half(side_k, side_v, side_gb, s0, half, i_h, i_hv, o_k, o_v, s_sk_slot, s_sv_slot, s_sg_slot,
               H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, TM: tl.constexpr):
    """Token 0 of half ``half`` of slot s0's side entry: k of key head i_h, v and (decay, beta) of value
    head i_hv (token t: + t H K, + t HV V, + t HV 2)."""
    pk = side_k + s0 * s_sk_slot + (half * TM * H + i_h) * K + o_k
    pv = side_v + s0 * s_sv_slot + (half * TM * HV + i_hv) * V + o_v
    pg = side_gb + s0 * s_sg_slot + (half * TM * HV + i_hv) * 2
    return pk, pv, pg


@triton.jit
def _replay_token(b_h, pk, pv, pg, t, H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr):
    """Token t of a side entry (``_side_half``) replayed onto the state tile b_h: the step's update
    (the order of its own token pass), no outputs."""
    r_k = tl.load(pk + t * (H * K))
    r_v = tl.load(pv + t * (HV * V)).to(tl.float32)
    r_d = tl.load(pg + t * (HV * 2))
    r_beta = tl.load(pg + t * (HV * 2) + 1)
    hk = tl.sum(b_h * r_k[None, :], 1) * r_d
    u = (r_v - hk) * r_beta
    return b_h * r_d + u[:, None] * r_k[None, :]


@triton.jit(do_not_specialize=["scale", "norm_eps"])
def _replay_step_kernel(
    x, a, b, A_log, dt_bias, o, state, indices, num_accepted, cu_seqlens, z, norm_w, ws, counter,
    side_k, side_v, side_gb, meta,
    scale, norm_eps, s_x_tok, s_a_tok, s_b_tok, s_z_tok, s_z_head, s_state_slot, s_idx_seq,
    s_sk_slot, s_sv_slot, s_sg_slot,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr,
    COLS: tl.constexpr, TM: tl.constexpr, NVP: tl.constexpr, TP: tl.constexpr,
    SIGMOID_GATE: tl.constexpr, ROUND_BASE: tl.constexpr,
):
    NV: tl.constexpr = V // BV
    MW: tl.constexpr = 2 + TM  # meta row: parity, pending, TM column slots
    i_v, i_n, i_hv, i_h = _program(H, HV, V, BV)

    bos = tl.load(cu_seqlens + i_n).to(tl.int64)
    n_tok = tl.load(cu_seqlens + i_n + 1).to(tl.int64) - bos
    if n_tok <= 0:
        return
    p_idx = indices + i_n.to(tl.int64) * s_idx_seq
    s0 = tl.load(p_idx).to(tl.int64)
    o_k = tl.arange(0, K)
    o_v = i_v * BV + tl.arange(0, BV)
    p_o = o + bos * (HV * V) + i_hv * V + o_v
    acc = tl.load(num_accepted + i_n).to(tl.int64)
    # padding, or num_accepted outside [1, COLS] (vLLM's CUDA op then reads and writes no state):
    # zero outputs, as PK0003's step
    ok = (s0 > 0) & (acc >= 1) & (acc <= COLS)
    p_meta = meta + (s0 * HV + i_hv) * MW
    par = tl.load(p_meta, mask=ok, other=0)
    pending = tl.load(p_meta + 1, mask=ok, other=0)
    # without a side entry the initial state is vLLM's snapshot, column acc - 1
    src = tl.load(p_idx + (acc - 1), mask=ok & (pending <= 0), other=0).to(tl.int64)
    # padding (slot <= 0), or num_accepted outside [1, COLS] (vLLM's CUDA op then reads and
    # writes no state): zero outputs, as PK0003's step
    if (s0 <= 0) | (acc < 1) | (acc > COLS) | ((pending <= 0) & (src <= 0)):
        zero = tl.zeros([BV], dtype=tl.float32).to(o.dtype.element_ty)
        for t in range(n_tok):
            tl.store(p_o + t * (HV * V), zero)
        return
    tile = i_hv * (V * K) + o_v[:, None] * K + o_k[None, :]
    if pending > 0:  # replay: the base is in slot s0
        b_h = tl.load(state + s0 * s_state_slot + tile).to(tl.float32)
        n_rep = tl.minimum(acc, pending)  # vLLM's acc never exceeds the last step's tokens
        pk, pv, pg = _side_half(side_k, side_v, side_gb, s0, par, i_h, i_hv, o_k, o_v, s_sk_slot, s_sv_slot,
                                s_sg_slot, H, HV, K, V, TM)
        for t in range(n_rep):
            b_h = _replay_token(b_h, pk, pv, pg, t, H, HV, K, V)
        if ROUND_BASE:  # vLLM's snapshot of column acc - 1 is stored in the pool dtype
            b_h = b_h.to(state.dtype.element_ty).to(tl.float32)
    else:
        b_h = tl.load(state + src * s_state_slot + tile).to(tl.float32)
    # the one state write of the step: the base of the next
    tl.store(state + s0 * s_state_slot + tile, b_h.to(state.dtype.element_ty))

    neg_A = -tl.exp(tl.load(A_log + i_hv).to(tl.float32))
    b_dt = tl.load(dt_bias + i_hv).to(tl.float32)
    wpar = 1 - par
    wk, wv, wg = _side_half(side_k, side_v, side_gb, s0, wpar, i_h, i_hv, o_k, o_v, s_sk_slot, s_sv_slot, s_sg_slot,
                            H, HV, K, V, TM)
    write_k = (i_v == 0) & (i_hv % (HV // H) == 0)
    p_q = x + bos * s_x_tok + i_h * K + o_k
    p_k = x + bos * s_x_tok + H * K + i_h * K + o_k
    p_vv = x + bos * s_x_tok + 2 * H * K + i_hv * V + o_v
    for t in range(n_tok):
        b_q = tl.load(p_q + t * s_x_tok).to(tl.float32)
        b_k = tl.load(p_k + t * s_x_tok).to(tl.float32)
        b_vr = tl.load(p_vv + t * s_x_tok)
        b_v = b_vr.to(tl.float32)
        b_x = tl.load(a + (bos + t) * s_a_tok + i_hv).to(tl.float32)
        b_b = tl.load(b + (bos + t) * s_b_tok + i_hv).to(tl.float32)
        xx = b_x + b_dt
        sp = tl.where(xx <= 20.0, tl.log(1.0 + tl.exp(xx)), xx)
        decay = tl.exp(neg_A * sp)
        beta = tl.sigmoid(b_b)
        b_q = b_q / tl.sqrt(tl.sum(b_q * b_q) + 1e-6)
        b_k = b_k / tl.sqrt(tl.sum(b_k * b_k) + 1e-6)
        b_q = b_q * scale
        kq = tl.sum(b_k * b_q)
        hk = tl.sum(b_h * b_k[None, :], 1) * decay
        hq = tl.sum(b_h * b_q[None, :], 1) * decay
        u = (b_v - hk) * beta
        b_o = (hq + u * kq).to(o.dtype.element_ty)
        b_h = b_h * decay + u[:, None] * b_k[None, :]
        tl.store(p_o + t * (HV * V), b_o)
        b_of = b_o.to(tl.float32)
        tl.store(ws + ((bos + t) * HV + i_hv) * NVP + i_v, tl.sum(b_of * b_of))
        # this token's inputs to the side buffer's other half, for the next step's replay
        tl.store(wv + t * (HV * V), b_vr)
        if write_k:
            tl.store(wk + t * (H * K), b_k)
        if i_v == 0:
            tl.store(wg + t * (HV * 2), decay)
            tl.store(wg + t * (HV * 2) + 1, beta)

    tl.debug_barrier()
    arrived = tl.atomic_add(counter + i_n.to(tl.int64) * HV + i_hv, 1, sem="acq_rel")
    if arrived == NV - 1:  # every program of this (request, value head) has read the old half
        _k._norm_head_rows(o, HV * V, V, z, s_z_tok, s_z_head, ws, norm_w, bos, n_tok, i_hv, norm_eps,
                           HV, V, BV, NV, NVP, TP, SIGMOID_GATE)
        o_c = tl.arange(0, TM)
        cols = tl.load(p_idx + o_c, mask=o_c < COLS, other=0)
        tl.store(p_meta + 2 + o_c, cols.to(tl.int32))
        tl.store(p_meta + 1, n_tok.to(tl.int32))
        tl.store(p_meta, wpar)
        tl.atomic_xchg(counter + i_n.to(tl.int64) * HV + i_hv, 0, sem="relaxed")


@triton.jit
def _materialize_kernel(state, slots, side_k, side_v, side_gb, meta, s_state_slot, s_sk_slot, s_sv_slot, s_sg_slot,
                        H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr,
                        TM: tl.constexpr):
    """Per listed slot with a side entry: vLLM's T snapshots of that step, each to its column slot."""
    MW: tl.constexpr = 2 + TM
    i_v, i_s, i_hv, i_h = _program(H, HV, V, BV)
    s0 = tl.load(slots + i_s).to(tl.int64)
    if s0 <= 0:
        return
    p_meta = meta + (s0 * HV + i_hv) * MW
    par = tl.load(p_meta)
    pending = tl.load(p_meta + 1)
    if pending <= 0:
        return
    o_k = tl.arange(0, K)
    o_v = i_v * BV + tl.arange(0, BV)
    tile = i_hv * (V * K) + o_v[:, None] * K + o_k[None, :]
    b_h = tl.load(state + s0 * s_state_slot + tile).to(tl.float32)
    pk, pv, pg = _side_half(side_k, side_v, side_gb, s0, par, i_h, i_hv, o_k, o_v, s_sk_slot, s_sv_slot, s_sg_slot,
                            H, HV, K, V, TM)
    for t in range(pending):
        b_h = _replay_token(b_h, pk, pv, pg, t, H, HV, K, V)
        col = tl.load(p_meta + 2 + t).to(tl.int64)
        if col > 0:
            tl.store(state + col * s_state_slot + tile, b_h.to(state.dtype.element_ty))


@dataclass
class _Side:
    k: torch.Tensor      # [slots, 2, TM, H, K] float32 (L2-normalised k)
    v: torch.Tensor      # [slots, 2, TM, HV, V] in the activations' dtype
    gb: torch.Tensor     # [slots, 2, TM, HV, 2] float32 (decay, beta)
    meta: torch.Tensor   # [slots, HV, 2 + TM] int32 (parity, pending, column slots)
    counter: torch.Tensor  # [max requests * HV] int32 arrivals, zero between launches


def why_not(state: torch.Tensor, mixed_qkv: torch.Tensor, state_indices: torch.Tensor, *,
            mamba_cache_mode: str = "none", kv_transfer: bool = False, num_prefills: int = 0,
            num_decodes: int = 0, max_tokens: int = 8) -> str | None:
    """The reason code (``FALLBACKS``) why a batch keeps vLLM's snapshot path, or None when replay takes it."""
    if mamba_cache_mode != "none":
        return "gdn_replay_prefix_caching"
    if kv_transfer:
        return "gdn_replay_kv_transfer"
    if num_prefills or num_decodes:
        return "gdn_replay_mixed_batch"
    if (state.dim() != 4 or state.dtype not in (torch.float32, torch.bfloat16) or state.stride(3) != 1
            or state.stride(2) != state.shape[3] or state.stride(1) != state.shape[2] * state.shape[3]):
        return "gdn_replay_unsupported"
    hv, vd, kd = state.shape[1], state.shape[2], state.shape[3]
    qk = mixed_qkv.shape[1] - hv * vd
    h = qk // (2 * kd) if qk > 0 else 0
    if h <= 0 or hv % h or kd & (kd - 1) or vd & (vd - 1) or kd > 256 or vd > 1024:
        return "gdn_replay_unsupported"
    if state_indices.dim() != 2 or state_indices.shape[1] > max_tokens or state_indices.stride(1) != 1:
        return "gdn_replay_unsupported"
    if state.device.type != "cuda" and not _k.interpreting():
        return "gdn_replay_unsupported"
    return None


def cuda_source() -> str:
    """replay.cu with the state-row header it includes (rows.cuh, shared with step.cu)."""
    return _cudart.read_source(CUDA_SOURCE)


#: the persistent variants of the one-kernel step (``GdnReplay(persistent=...)``), by kernel name:
#: "l2" prefetches the next tile's state to L2 during this tile's passes, "copy" copies it into a
#: shared-memory buffer by TMA (cp.async.bulk) during them
PERSISTENT_KERNELS = {"l2": "gdn_replay_step_persistent", "copy": "gdn_replay_step_copy"}
#: replay.cu's KSEL per kernel (the kernel one compile holds)
_KSEL = {"gdn_replay_step": 0, PERSISTENT_KERNELS["l2"]: 1, PERSISTENT_KERNELS["copy"]: 2,
         "gdn_replay_materialize": 3}
#: shared memory one block may have on sm_90 with the opt-in attribute
MAX_SMEM_PER_BLOCK = 227 * 1024


def step_smem_bytes(K: int, V: int, TM: int) -> int:
    """An upper bound of ``sizeof(StepSmem)`` (replay.cu static_asserts it: STEP_SMEM_MAX)."""
    return 4 * (3 * TM * K + 3 * TM * V + 2 * TM + 5 * TM) + 16 * 8 + 16


def copy_smem_bytes(K: int, V: int, TM: int, state_bytes: int) -> int:
    """Dynamic shared memory of ``gdn_replay_step_copy``: the state buffer, its mbarrier (128 bytes), StepSmem."""
    return V * K * state_bytes + 128 + step_smem_bytes(K, V, TM)


def cuda_unsupported(state: torch.Tensor, num_k_heads: int, TM: int, act_dtype: torch.dtype, P: int,
                     R: int = 1) -> str | None:
    """Why the CUDA kernel does not take this layer (the Triton kernel then does), or None."""
    if state.device.type != "cuda" or _k.interpreting():
        return "not a CUDA device (or the Triton interpreter is on)"
    _, hv, vd, kd = state.shape
    if state.dtype not in (torch.float32, torch.bfloat16) or act_dtype not in _KIND:
        return f"state {state.dtype} / activations {act_dtype}"
    epc = 16 // state.element_size()
    nt = (vd // R) * P if R > 0 and vd % R == 0 else 0
    if kd % 32 or kd > 256 or P & (P - 1) or P > 32 or kd % (epc * P) or nt % 32 or not 0 < nt <= 1024 \
            or R * kd // P > 64:
        return f"K = {kd}, V = {vd} with {P} lanes per row and {R} rows per thread"
    if TM > 8 or step_smem_bytes(kd, vd, TM) > 48 * 1024 or num_k_heads <= 0 or hv % num_k_heads:
        return f"TM = {TM}, K = {kd}, V = {vd}, HV = {hv}, H = {num_k_heads}"
    try:
        _cudart.nvrtc_version()
    except _cudart.CudaUnavailable as exc:
        return str(exc)
    return None


class GdnReplay:
    """One GDN layer's replay side buffer over its state pool ``[slots, HV, V, K]``.

    ``step`` takes the arguments of vLLM's ``fused_gdn_decode_post_conv_mtp`` (a pure
    spec-verify batch) and gives its outputs; the pool then holds each request's base state
    in its column-0 slot instead of T snapshots. Before any other path reads or writes a
    slot of the pool, call ``materialize`` (the slot's owner continues) or ``invalidate``
    (the slot changed owner) for it.
    """

    def __init__(self, state: torch.Tensor, num_k_heads: int, max_tokens: int = 8, max_requests: int = 1024,
                 act_dtype: torch.dtype = torch.bfloat16, backend: str | None = None,
                 threads_per_row: int | None = None, min_blocks: int | None = None, prefetch: bool | None = None,
                 rows_per_thread: int | None = None, persistent: str | None = None,
                 scatter_sums: bool = True):
        """``backend``: ``"cuda"`` (the NVRTC kernel, ``replay.cu``), ``"triton"``, or None: CUDA where
        :func:`cuda_unsupported` finds nothing against it, else Triton (the reason logged once).
        ``threads_per_row``/``rows_per_thread``/``min_blocks``/``prefetch``: the CUDA kernel's P (lanes per
        state row), R (rows per thread), the blocks per SM asked of its register allocator and its early L2
        prefetch of the state tile (defaults: K / 16 lanes, 2 rows (fp32 pool) or 4 (bf16), 2 blocks, prefetch
        with an fp32 pool: 16 columns x R rows of float32 per thread, each k value loaded from shared memory
        once per token for 2 R FMAs). ``persistent``: the step on a grid of (blocks per SM) x (SMs) blocks
        that each run several (request, value head) tiles, bringing the next tile's state in while this one's
        passes run: ``"l2"`` (an L2 prefetch) or ``"copy"`` (a TMA copy into a shared-memory buffer); None:
        one tile per block. ``scatter_sums``: each token's row sums over the row's lanes by one reduce-scatter
        (``rows.cuh``'s ``scatter_sums``; PK0003's suffix ``x``) instead of one xor butterfly per sum: the default,
        2-5% faster at batch 32-256 on the H200 (docs/gdn-replay.md). Same bits."""
        slots, hv, vd, kd = state.shape
        self.state, self.H, self.HV, self.V, self.K = state, num_k_heads, hv, vd, kd
        self.TM = triton.next_power_of_2(max_tokens)
        # defaults: the configs the H200 autotune chose per pool dtype (docs/gdn-replay.md)
        f32 = state.dtype == torch.float32
        self.P = threads_per_row or max(1, kd // 16)
        self.R = rows_per_thread or (2 if f32 else 4)
        self.threads = (vd // self.R) * self.P if vd % self.R == 0 else 0
        self.min_blocks = min_blocks or (2 if self.threads <= 512 else 1)
        self.prefetch = f32 if prefetch is None else prefetch
        self.scatter_sums = bool(scatter_sums)
        if persistent not in (None, *PERSISTENT_KERNELS):
            raise ValueError(f"GdnReplay: persistent must be None or one of {sorted(PERSISTENT_KERNELS)}")
        if persistent == "copy" and copy_smem_bytes(kd, vd, self.TM, state.element_size()) > MAX_SMEM_PER_BLOCK:
            raise ValueError(f"GdnReplay: persistent 'copy': a [{vd}, {kd}] state tile and the step's buffers "
                             f"need more than {MAX_SMEM_PER_BLOCK} bytes of shared memory")
        self.persistent = persistent
        self._grid_cap: dict[str, int] = {}
        why = cuda_unsupported(state, num_k_heads, self.TM, act_dtype, self.P, self.R)
        if backend is None:
            backend = "triton" if why else "cuda"
            if why and state.device.type == "cuda" and why not in _LOGGED:
                _LOGGED.add(why)
                LOG.warning("sndr GDN replay: the Triton kernel instead of the CUDA one: %s (logged once)", why)
        elif backend == "cuda" and why:
            raise ValueError(f"GdnReplay: backend 'cuda': {why}")
        elif backend not in ("cuda", "triton"):
            raise ValueError(f"GdnReplay: backend must be 'cuda' or 'triton', not {backend!r}")
        self.backend = backend
        self._cuda_kernels: dict[tuple, _cudart.Kernel] = {}
        dev = state.device
        tm = self.TM
        self.side = _Side(
            k=torch.zeros(slots, 2, tm, num_k_heads, kd, dtype=torch.float32, device=dev),
            v=torch.zeros(slots, 2, tm, hv, vd, dtype=act_dtype, device=dev),
            gb=torch.zeros(slots, 2, tm, hv, 2, dtype=torch.float32, device=dev),
            meta=torch.zeros(slots, hv, 2 + tm, dtype=torch.int32, device=dev),
            counter=torch.zeros(max_requests * hv, dtype=torch.int32, device=dev),
        )
        self._ws: torch.Tensor | None = None
        self._retired: list[torch.Tensor] = []

    def side_bytes_per_token(self) -> int:
        """Bytes of side-buffer inputs one verify token writes (and a replayed one reads)."""
        return self.H * self.K * 4 + self.HV * self.V * self.side.v.element_size() + self.HV * 8

    def block_v(self, n_req: int) -> int:
        cfg = _k.pick_config(n_req, self.HV, self.V, self.K, self.state.device, state_dtype=self.state.dtype,
                             fused_norm=True)
        return min(cfg.block_v, self.V)

    def step(self, mixed_qkv, a, b, A_log, dt_bias, state_indices, cu_seqlens, num_accepted_tokens, state,
             output_gate, norm_weight, out, scale: float, norm_eps: float, activation: str = "silu",
             block_v: int | None = None, num_warps: int | None = None):
        """The replayed verify step (returns ``out``: the gated RMSNorm of every token's output).

        Raises ValueError for a call outside this buffer's contract (another pool, more
        requests or columns than it was made for, another activation dtype, layouts the
        kernel does not address)."""
        why = self._why_bad(mixed_qkv, state_indices, state, output_gate, out)
        if why:
            raise ValueError(f"GdnReplay.step: {why}")
        n_req = state_indices.shape[0]
        if n_req == 0:
            return out
        side = self.side
        cols = state_indices.shape[1]
        if self.backend == "cuda":
            self._cuda_step(mixed_qkv, a, b, A_log, dt_bias, state_indices, cu_seqlens, num_accepted_tokens,
                            output_gate, norm_weight, out, scale, norm_eps, activation)
            return out
        bv = block_v or self.block_v(n_req)
        nv = self.V // bv
        nvp = triton.next_power_of_2(nv)
        n_parts = out.shape[0] * self.HV * nvp
        if self._ws is None or self._ws.numel() < n_parts:
            if self._ws is not None:  # a captured CUDA graph may still point at it: never freed
                self._retired.append(self._ws)
            self._ws = torch.empty(max(n_parts, 1 << 16), dtype=torch.float32, device=state.device)
        _replay_step_kernel[(n_req * self.HV * nv,)](
            mixed_qkv, a, b, A_log, dt_bias, out, state, state_indices, num_accepted_tokens, cu_seqlens,
            output_gate, norm_weight, self._ws, side.counter, side.k, side.v, side.gb, side.meta,
            float(scale), float(norm_eps), mixed_qkv.stride(0), a.stride(0), b.stride(0), output_gate.stride(0),
            output_gate.stride(1), state.stride(0), state_indices.stride(0),
            side.k.stride(0), side.v.stride(0), side.gb.stride(0),
            H=self.H, HV=self.HV, K=self.K, V=self.V, BV=bv, COLS=cols, TM=self.TM, NVP=nvp,
            TP=min(triton.next_power_of_2(cols), 8), SIGMOID_GATE=activation == "sigmoid",
            ROUND_BASE=state.dtype != torch.float32,
            num_warps=num_warps or (1 if bv * self.K <= 4096 else 4), num_stages=1)
        return out

    def cuda_defines(self, name: str, kinds: dict[str, int]) -> dict[str, int | str]:
        """replay.cu's NVRTC defines for kernel ``name`` with this call's tensor ``kinds`` (what
        ``_cuda_kernel`` builds; ``benchmarks/gdn_sass_digest.py`` digests the same builds)."""
        defs: dict[str, int | str] = {
            "H": self.H, "HV": self.HV, "K": self.K, "V": self.V, "P": self.P, "R": self.R, "TM": self.TM,
            "STEP_SMEM_MAX": step_smem_bytes(self.K, self.V, self.TM), "MINB": self.min_blocks,
            "PREFETCH": int(self.prefetch), "S_KIND": _KIND[self.state.dtype], "X_KIND": _KIND[self.side.v.dtype],
            "AB_KIND": 0, "ALOG_KIND": 0, "DT_KIND": 0, "Z_KIND": 0, "W_KIND": 0, "O_KIND": 0, "SIGMOID_GATE": 0}
        if self.scatter_sums:  # (absent otherwise: the butterfly builds' cubin keys stay as they were)
            defs["SCATTER_SUMS"] = 1
        defs.update(kinds)
        defs["KSEL"] = _KSEL[name]  # NVRTC compiles only this launch's kernel(s)
        return defs

    def _cuda_kernel(self, name: str, kinds: dict[str, int]) -> _cudart.Kernel:
        defs = self.cuda_defines(name, kinds)
        key = (name, tuple(sorted(defs.items())))
        k = self._cuda_kernels.get(key)
        if k is None:
            idx = self.state.device.index
            smem = copy_smem_bytes(self.K, self.V, self.TM, self.state.element_size()) \
                if name == PERSISTENT_KERNELS["copy"] else 0
            k = self._cuda_kernels[key] = _cudart.load_kernel(
                cuda_source(), name, defs, torch.cuda.current_device() if idx is None else idx, dynamic_smem=smem,
                label="gdn_replay")
        return k

    def _cuda_step(self, x, a, b, A_log, dt_bias, idx, cu, acc, z, w, out, scale, eps, activation) -> None:
        for name, t in (("a", a), ("b", b), ("A_log", A_log), ("dt_bias", dt_bias), ("norm_weight", w)):
            if t.dtype not in _KIND or t.stride(-1) != 1:
                raise ValueError(f"GdnReplay.step: {name} must be float32/16 or bfloat16 with a unit last stride")
        if a.dtype != b.dtype or out.dtype not in _KIND or z.dtype not in _KIND:
            raise ValueError("GdnReplay.step: a and b of one dtype; out and output_gate float32/16 or bfloat16")
        for name, t in (("state_indices", idx), ("cu_seqlens", cu), ("num_accepted_tokens", acc)):
            if t.dtype != torch.int32 or (name != "state_indices" and not t.is_contiguous()):
                raise ValueError(f"GdnReplay.step: {name} must be int32 (contiguous)")
        kinds = {"AB_KIND": _KIND[a.dtype], "ALOG_KIND": _KIND[A_log.dtype], "DT_KIND": _KIND[dt_bias.dtype],
                 "Z_KIND": _KIND[z.dtype], "W_KIND": _KIND[w.dtype], "O_KIND": _KIND[out.dtype],
                 "SIGMOID_GATE": int(activation == "sigmoid")}
        side, st = self.side, self.state
        stream = torch.cuda.current_stream(st.device).cuda_stream
        grid = idx.shape[0] * self.HV
        name = PERSISTENT_KERNELS[self.persistent] if self.persistent else "gdn_replay_step"
        kern = self._cuda_kernel(name, kinds)
        ptrs = (x, a, b, A_log, dt_bias, out, st, idx, acc, cu, z, w, side.k, side.v, side.gb, side.meta)
        args: list = [ctypes.c_void_p(t.data_ptr()) for t in ptrs]
        args += [ctypes.c_float(scale), ctypes.c_float(eps), ctypes.c_int(idx.shape[1])]
        args += [ctypes.c_longlong(v) for v in (x.stride(0), a.stride(0), b.stride(0), z.stride(0), z.stride(1),
                                                st.stride(0), idx.stride(0), side.k.stride(0), side.v.stride(0),
                                                side.gb.stride(0))]
        if self.persistent:
            cap = self._grid_cap.get(name)
            if cap is None:  # resident blocks: the driver's occupancy for this kernel, times the SMs
                sms = torch.cuda.get_device_properties(st.device).multi_processor_count
                cap = self._grid_cap[name] = max(1, kern.blocks_per_sm(self.threads)) * sms
            args.append(ctypes.c_int(grid))  # n_tiles
            grid = min(grid, cap)
        kern.launch(grid, self.threads, stream, args)

    def _why_bad(self, mixed_qkv, state_indices, state, output_gate, out) -> str | None:
        if state.data_ptr() != self.state.data_ptr() or state.shape != self.state.shape:
            return "another state pool than the one this GdnReplay was made for"
        if state_indices.dim() != 2 or state_indices.stride(1) != 1 or state_indices.shape[1] > self.TM:
            return f"state_indices must be [N, <= {self.TM}] with unit column stride"
        if state_indices.shape[0] * self.HV > self.side.counter.numel():
            return "more requests than max_requests"
        if mixed_qkv.dtype != self.side.v.dtype:
            # the side buffer keeps v as given: another dtype would round it and break exactness
            return f"activations are {mixed_qkv.dtype}, the side buffer was made for {self.side.v.dtype}"
        if mixed_qkv.stride(1) != 1 or mixed_qkv.shape[1] != 2 * self.H * self.K + self.HV * self.V:
            return "mixed_qkv must be [tokens, 2 H K + HV V] with a unit last stride"
        if not out.is_contiguous() or tuple(out.shape) != (mixed_qkv.shape[0], self.HV, self.V):
            return "out must be a contiguous [tokens, HV, V]"
        if output_gate.stride(2) != 1 or tuple(output_gate.shape) != tuple(out.shape):
            return "output_gate must be [tokens, HV, V] with a unit last stride"
        return None

    def materialize(self, slots: torch.Tensor, block_v: int = 16) -> None:
        """vLLM's snapshots of each listed column-0 slot's pending step, then no entry (slots <= 0 skipped)."""
        slots = slots.reshape(-1).contiguous()
        if slots.numel() == 0:
            return
        side = self.side
        if self.backend == "cuda":
            # the same kernel source as the step's: the snapshots are the bits its passes had
            kern = self._cuda_kernel("gdn_replay_materialize", {})
            st, slots32 = self.state, slots.to(torch.int32)
            args: list = [ctypes.c_void_p(t.data_ptr()) for t in (st, slots32, side.k, side.v, side.gb, side.meta)]
            args += [ctypes.c_longlong(x) for x in (st.stride(0), side.k.stride(0), side.v.stride(0),
                                                    side.gb.stride(0))]
            kern.launch(slots.numel() * self.HV, self.threads, torch.cuda.current_stream(st.device).cuda_stream, args)
            self.invalidate(slots)
            return
        bv = min(block_v, self.V)
        _materialize_kernel[(slots.numel() * self.HV * (self.V // bv),)](
            self.state, slots, side.k, side.v, side.gb, side.meta, self.state.stride(0), side.k.stride(0),
            side.v.stride(0), side.gb.stride(0), H=self.H, HV=self.HV, K=self.K, V=self.V, BV=bv, TM=self.TM,
            num_warps=1, num_stages=1)
        self.invalidate(slots)

    def invalidate(self, slots: torch.Tensor) -> None:
        """Forget the side entries of these slots (their states stay as they are)."""
        s = slots.reshape(-1).long()
        s = s[s > 0] if s.device.type == "cpu" else torch.where(s > 0, s, torch.zeros_like(s))
        # slot 0 is vLLM's NULL block: never a request's, so clearing it is harmless
        self.side.meta[s, :, 1] = 0

    def pending(self, slot: int) -> int:
        """The token count of ``slot``'s side entry (0: none); reads the device."""
        return int(self.side.meta[slot, 0, 1])
