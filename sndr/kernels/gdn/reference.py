"""Pure-PyTorch reference for the gated delta-rule (GDN) decode step.

The naive recurrence, one sequence, one value head and one token at a time,
in float32 (or float64 when asked), with the gating computed from the raw
inputs exactly as vLLM 0.32.0's decode kernels do::

    g    = -exp(A_log) * softplus(a + dt_bias)      (softplus with beta, threshold)
    beta = sigmoid(b)
    q, k = q / sqrt(|q|^2 + 1e-6), k / sqrt(|k|^2 + 1e-6)   (when l2norm)
    S    = exp(g) * S                                S: [V, K]
    u    = beta * (v - S k)
    S    = S + u k^T
    o    = S (scale * q)

States live in a pool ``state[slot, HV, V, K]`` read and written in place
through ``ssm_state_indices``; an index <= 0 is a padding slot (vLLM's
NULL_BLOCK_ID is 0): nothing is read or written for that sequence and its
output rows are zero. With ``num_accepted_tokens`` (spec verify) the initial
state of sequence ``n`` is the slot in column ``num_accepted_tokens[n] - 1``
of its index row, and the state after token ``t`` is written to the slot in
column ``t`` (a per-token snapshot, so that rejected tokens roll back).

Slow and simple on purpose; the kernels are tested against it.
"""

from __future__ import annotations

import torch


def softplus(x: torch.Tensor, beta: float = 1.0, threshold: float = 20.0) -> torch.Tensor:
    """vLLM's softplus: ``log(1 + exp(beta x)) / beta`` below ``threshold``, ``x`` above it."""
    bx = beta * x
    return torch.where(bx <= threshold, torch.log1p(torch.exp(bx)) / beta, x)


def gates(a, b, A_log, dt_bias, sp_beta: float = 1.0, threshold: float = 20.0, dtype=torch.float32):
    """(g, beta) from the raw per-token, per-value-head inputs ``a``, ``b`` ([..., HV])."""
    x = a.to(dtype) + dt_bias.to(dtype)
    g = -torch.exp(A_log.to(dtype)) * softplus(x, sp_beta, threshold)
    return g, torch.sigmoid(b.to(dtype))


def _l2(x: torch.Tensor) -> torch.Tensor:
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + 1e-6)


def step(
    q: torch.Tensor,            # [N_tokens, H, K]
    k: torch.Tensor,            # [N_tokens, H, K]
    v: torch.Tensor,            # [N_tokens, HV, V]
    a: torch.Tensor,            # [N_tokens, HV]
    b: torch.Tensor,            # [N_tokens, HV]
    A_log: torch.Tensor,        # [HV]
    dt_bias: torch.Tensor,      # [HV]
    state: torch.Tensor,        # [slots, HV, V, K], updated in place
    ssm_state_indices: torch.Tensor,  # [N] or [N, T_max]
    cu_seqlens: torch.Tensor | None = None,  # [N + 1]; None: every sequence has T = tokens / N
    num_accepted_tokens: torch.Tensor | None = None,  # [N]
    scale: float | None = None,
    l2norm: bool = True,
    sp_beta: float = 1.0,
    threshold: float = 20.0,
    out: torch.Tensor | None = None,  # [N_tokens, HV, V]
    dtype: torch.dtype = torch.float32,
    strict_accepted: bool = False,  # vLLM's fused MTP op: accepted outside [1, columns] means no state
) -> torch.Tensor:
    """One decode / spec-verify step of every sequence; returns ``out`` ([N_tokens, HV, V]).

    The recurrence runs in ``dtype``; states are read and written in the
    pool's dtype (a bf16 pool is rounded once per written snapshot, as the
    kernels do). Token ``t`` of sequence ``n`` is row ``bos_n + t``.
    """
    n_tok, H, K = k.shape
    HV, V = v.shape[1], v.shape[2]
    if scale is None:
        scale = K**-0.5
    idx = ssm_state_indices
    if cu_seqlens is not None:
        bounds = [int(x) for x in cu_seqlens.tolist()]
        N = len(bounds) - 1
    else:
        N = idx.shape[0]
        T = n_tok // N
        bounds = [n * T for n in range(N + 1)]
    if out is None:
        out = torch.zeros(n_tok, HV, V, dtype=dtype, device=v.device)
    flat = idx.reshape(-1)
    seq_stride = idx.stride(0)
    tok_stride = idx.stride(1) if idx.dim() == 2 else 1
    g_all, beta_all = gates(a, b, A_log, dt_bias, sp_beta, threshold, dtype)
    for n in range(N):
        bos, eos = bounds[n], bounds[n + 1]
        if eos <= bos:
            continue
        i0 = 0
        if num_accepted_tokens is not None:
            i0 = max(int(num_accepted_tokens[n]) - 1, 0)
        slot0 = int(flat[n * seq_stride + i0 * tok_stride])
        if strict_accepted and num_accepted_tokens is not None:
            acc = int(num_accepted_tokens[n])
            if not 1 <= acc <= idx.shape[1]:
                slot0 = 0
        if slot0 <= 0:
            out[bos:eos] = 0
            continue
        for hv in range(HV):
            h = hv // (HV // H)
            S = state[slot0, hv].to(dtype).clone()  # [V, K]
            for t in range(eos - bos):
                tok = bos + t
                qt, kt = q[tok, h].to(dtype), k[tok, h].to(dtype)
                if l2norm:
                    qt, kt = _l2(qt), _l2(kt)
                qt = qt * scale
                S = S * torch.exp(g_all[tok, hv])
                u = beta_all[tok, hv] * (v[tok, hv].to(dtype) - S @ kt)
                S = S + torch.outer(u, kt)
                out[tok, hv] = (S @ qt).to(out.dtype)
                slot_t = int(flat[n * seq_stride + t * tok_stride])
                if slot_t > 0:
                    state[slot_t, hv] = S.to(state.dtype)
    return out


def gated_rmsnorm(o: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float, activation: str = "silu",
                  dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """vLLM's RMSNormGated with norm_before_gate, group = the last dim: ``rmsnorm(o) * w * act(z)``."""
    o, z, w = o.to(dtype), z.to(dtype), weight.to(dtype)
    rstd = torch.rsqrt((o * o).mean(-1, keepdim=True) + eps)
    gate = torch.sigmoid(z) if activation == "sigmoid" else z * torch.sigmoid(z)
    return o * rstd * w * gate


def post_conv_mtp(mixed_qkv, a, b, A_log, dt_bias, state_indices, cu_seqlens, num_accepted_tokens, state,
                  output_gate, norm_weight, scale: float, norm_eps: float, activation: str = "silu",
                  dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``torch.ops._C.fused_gdn_decode_post_conv_mtp``'s result, naively (state updated in place).

    ``mixed_qkv`` [tokens, 2 H K + HV V] is split into q | k | v; the initial state of
    request ``n`` is column ``num_accepted_tokens[n] - 1`` of its index row (no state
    unless 1 <= accepted <= columns), token ``t``'s state goes to column ``t``; the
    output is the gated RMSNorm of the recurrence's output, in ``dtype``.
    """
    HV, V, K = state.shape[1], state.shape[2], state.shape[3]
    n_tok = mixed_qkv.shape[0]
    H = (mixed_qkv.shape[1] - HV * V) // (2 * K)
    q = mixed_qkv[:, : H * K].reshape(n_tok, H, K)
    k = mixed_qkv[:, H * K: 2 * H * K].reshape(n_tok, H, K)
    v = mixed_qkv[:, 2 * H * K:].reshape(n_tok, HV, V)
    o = step(q, k, v, a, b, A_log, dt_bias, state, state_indices, cu_seqlens=cu_seqlens,
             num_accepted_tokens=num_accepted_tokens, scale=scale, dtype=dtype, strict_accepted=True)
    return gated_rmsnorm(o, output_gate, norm_weight, norm_eps, activation, dtype)


def post_conv_mtp_dense(mixed_qkv, a, b, A_log, dt_bias, state_indices, num_accepted_tokens, state, output_gate,
                        norm_weight, scale: float, norm_eps: float, activation: str = "silu",
                        dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """:func:`post_conv_mtp` vectorised over requests and heads, for benchmark-sized checks.

    Every request has T = ``state_indices.shape[1]`` tokens (rows ``n T .. n T + T - 1``)
    and valid slots (> 0), ``1 <= num_accepted_tokens <= T``. T = 1 with
    ``num_accepted_tokens`` all 1 is the plain decode. ``state`` is updated in place
    (token t's state to column t); returns the normed output [tokens, HV, V] in ``dtype``.
    """
    HV, V, K = state.shape[1], state.shape[2], state.shape[3]
    N, T = state_indices.shape
    H = (mixed_qkv.shape[1] - HV * V) // (2 * K)
    rep = HV // H
    x = mixed_qkv.to(dtype).view(N, T, -1)
    q = _l2(x[..., : H * K].reshape(N, T, H, K)).repeat_interleave(rep, dim=2) * scale
    k = _l2(x[..., H * K: 2 * H * K].reshape(N, T, H, K)).repeat_interleave(rep, dim=2)
    v = x[..., 2 * H * K:].reshape(N, T, HV, V)
    g, beta = gates(a.reshape(N, T, HV), b.reshape(N, T, HV), A_log, dt_bias, dtype=dtype)
    idx = state_indices.long()
    src = idx.gather(1, (num_accepted_tokens.long() - 1)[:, None])[:, 0]
    S = state[src].to(dtype)  # [N, HV, V, K]
    o = torch.empty(N, T, HV, V, dtype=dtype, device=state.device)
    for t in range(T):
        S = S * torch.exp(g[:, t])[..., None, None]
        u = beta[:, t, :, None] * (v[:, t] - (S @ k[:, t, :, :, None])[..., 0])
        S = S + u[..., None] * k[:, t, :, None, :]
        o[:, t] = (S @ q[:, t, :, :, None])[..., 0]
        state[idx[:, t]] = S.to(state.dtype)
    return gated_rmsnorm(o.reshape(N * T, HV, V), output_gate, norm_weight, norm_eps, activation, dtype)


def state_bytes(n_seqs: int, hv: int, v: int, k: int, itemsize: int) -> int:
    """Bytes of the states ``n_seqs`` sequences touch (one read or one write)."""
    return n_seqs * hv * v * k * itemsize

