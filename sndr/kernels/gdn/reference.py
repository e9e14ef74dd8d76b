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


def state_bytes(n_seqs: int, hv: int, v: int, k: int, itemsize: int) -> int:
    """Bytes of the states ``n_seqs`` sequences touch (one read or one write)."""
    return n_seqs * hv * v * k * itemsize

