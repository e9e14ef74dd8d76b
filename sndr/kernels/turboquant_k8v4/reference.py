"""Pure-PyTorch reference for the TurboQuant k8v4 cache: pack, unpack, store,
dequantize-then-attend. Slow and simple on purpose; the kernels are tested
against it.

The arithmetic of ``pack`` follows vLLM 0.32.0's ``_tq_fused_store_fp8``
expression for expression (float32 throughout, truncating int cast), so on
the CPU the bytes agree exactly. Keys are clamped to +-448 before the fp8
cast: the GPU cast saturates there, torch's does not.
"""

from __future__ import annotations

import torch

from ._layout import FP8_MAX, LOG2E, Layout


def pack(key: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """[..., D] keys and values -> [..., slot_size_aligned] uint8 slots."""
    d = key.shape[-1]
    lay = Layout(d)
    if d % 2:
        raise ValueError(f"head_dim {d} must be even")
    k8 = key.float().clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).view(torch.uint8)

    v = value.float()
    vmin = v.amin(-1, keepdim=True)
    vmax = v.amax(-1, keepdim=True)
    scale = (vmax - vmin) / 15.0
    scale = torch.where(scale > 1e-8, scale, torch.full_like(scale, 1e-8))
    codes = ((v - vmin) / scale + 0.5).to(torch.int32).clamp(0, 15)
    packed = ((codes[..., 0::2] & 0xF) | ((codes[..., 1::2] & 0xF) << 4)).to(torch.uint8)

    sc = scale.to(torch.float16).contiguous().view(torch.uint8)  # [..., 2] little endian
    zr = vmin.to(torch.float16).contiguous().view(torch.uint8)
    out = torch.zeros(*key.shape[:-1], lay.slot_size_aligned, dtype=torch.uint8)
    out[..., : lay.key_bytes] = k8
    out[..., lay.key_bytes : lay.scale_offset] = packed
    out[..., lay.scale_offset : lay.scale_offset + 2] = sc
    out[..., lay.zero_offset : lay.zero_offset + 2] = zr
    return out


def unpack(slots: torch.Tensor, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """[..., slot] uint8 -> (key, value) float32 [..., D], exactly as stored."""
    lay = Layout(head_dim)
    s = slots.contiguous()
    k = s[..., : lay.key_bytes].contiguous().view(torch.float8_e4m3fn).float()
    data = s[..., lay.key_bytes : lay.scale_offset].to(torch.int32)
    codes = torch.stack([data & 0xF, data >> 4], dim=-1).flatten(-2)[..., :head_dim].float()
    scale = s[..., lay.scale_offset : lay.scale_offset + 2].contiguous().view(torch.float16).float()
    zero = s[..., lay.zero_offset : lay.zero_offset + 2].contiguous().view(torch.float16).float()
    return k, codes * scale + zero


def store(key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Write [N, H, D] key/value into kv_cache [blocks, page, H, slot] at slot_mapping; -1 is skipped."""
    page = kv_cache.shape[1]
    slots = pack(key.cpu(), value.cpu()).to(kv_cache.device)
    lay = Layout(key.shape[-1])
    for i, s in enumerate(slot_mapping.tolist()):
        if s < 0:
            continue
        # the alignment pad byte is never written by vLLM's kernel either
        kv_cache[s // page, s % page, :, : lay.slot_size] = slots[i, :, : lay.slot_size]


def gather(kv_cache: torch.Tensor, block_table: torch.Tensor, seq_len: int, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence's (key, value) float32 [Hk, seq_len, D] from the paged cache."""
    page = kv_cache.shape[1]
    pos = torch.arange(seq_len)
    blocks = block_table[pos // page].long().cpu()
    slots = kv_cache.cpu()[blocks, pos % page]  # [L, Hk, slot]
    k, v = unpack(slots, head_dim)
    return k.transpose(0, 1), v.transpose(0, 1)


def decode(query: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor, seq_lens: torch.Tensor, scale: float) -> torch.Tensor:
    """Decode attention in float64: query [B, Hq, D] -> [B, Hq, D] float64.

    A sequence of length 0 gives zeros.
    """
    b_, hq, d = query.shape
    hk = kv_cache.shape[2]
    g = hq // hk
    out = torch.zeros(b_, hq, d, dtype=torch.float64)
    for b in range(b_):
        n = int(seq_lens[b])
        if n == 0:
            continue
        k, v = gather(kv_cache, block_table[b], n, d)
        k = k.double().repeat_interleave(g, dim=0)  # [Hq, L, D]
        v = v.double().repeat_interleave(g, dim=0)
        q = query[b].double().cpu()  # [Hq, D]
        s = torch.einsum("hd,hld->hl", q, k) * scale
        p = torch.softmax(s, dim=-1)
        out[b] = torch.einsum("hl,hld->hd", p, v)
    return out


def spec_verify(query: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor, seq_lens: torch.Tensor,
              scale: float, num_spec: int) -> torch.Tensor:
    """PK0002's spec-verify attention in float64 on the CPU: K + 1 separate decode calls (:func:`decode`),
    call t with lengths seq_len - K + t."""
    n, hq, d = query.shape
    ql = num_spec + 1
    b = n // ql
    q = query.cpu().view(b, ql, hq, d)
    bt = block_table[:b].cpu()
    sl = seq_lens[:b].cpu().long()
    out = torch.zeros(b, ql, hq, d, dtype=torch.float64)
    for t in range(ql):
        lens = (sl - num_spec + t).clamp_min(0).to(torch.int32)
        out[:, t] = decode(q[:, t], kv_cache.cpu(), bt, lens, scale)
    return out.view(n, hq, d)

def split_of(seq_len: int, splits: int, min_tiles: int) -> tuple[int, int, int]:
    """(tiles, tiles per split, active splits): decode_k8v4.cu's split_of, for the emulation."""
    from .mtp_verify import TILE  # (the kernels' tile, 16 tokens)

    n_tiles = (seq_len + TILE - 1) // TILE
    act = min(splits, (n_tiles + min_tiles - 1) // min_tiles)
    per = max((n_tiles + max(act, 1) - 1) // max(act, 1), 1)
    return n_tiles, per, (n_tiles + per - 1) // per


EMPTY_LSE = -1e30


def emulate_verify(query: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor, seq_lens: torch.Tensor,
            scale: float, num_spec: int, splits: int, min_tiles: int = 2) -> torch.Tensor:
    """mtp_verify's CUDA kernel's algorithm in float64 on the CPU: the same split boundaries, per-row causal
    limits, empty-row partials (o = 0, lse = EMPTY_LSE) and merge. Checks the contract between
    ``tq_k8v4_verify_page`` and ``tq_k8v4_merge``, not the fragment arithmetic (the GPU tests do)."""
    n, hq, d = query.shape
    ql = num_spec + 1
    b = n // ql
    hk = kv_cache.shape[2]
    g = hq // hk
    out = torch.zeros(b, ql, hq, d, dtype=torch.float64)
    cache = kv_cache.cpu()
    for i in range(b):
        sl = int(seq_lens[i])
        n_tiles, per, n_act = split_of(sl, splits, min_tiles)
        if n_act == 0:
            continue
        k, v = gather(cache, block_table[i].cpu(), sl, d)  # [Hk, L, D]
        k = k.double().repeat_interleave(g, 0)
        v = v.double().repeat_interleave(g, 0)
        q = query[i * ql:(i + 1) * ql].double().cpu()  # [QL, Hq, D]
        s = torch.einsum("thd,hld->thl", q, k) * scale * LOG2E  # log2 units
        pos = torch.arange(sl)
        lim = (sl - num_spec + torch.arange(ql))[:, None, None]  # row t sees [0, lim_t)
        s = s.masked_fill(pos[None, None, :] >= lim, float("-inf"))
        o_parts, l_parts = [], []
        for sp in range(n_act):
            lo, hi = 16 * sp * per, min(16 * (sp + 1) * per, sl)
            ss = s[..., lo:hi]
            m = ss.amax(-1, keepdim=True).clamp_min(EMPTY_LSE)
            p = torch.exp2(ss - m)
            l_ = p.sum(-1, keepdim=True)
            o = torch.einsum("thl,hld->thd", p, v[:, lo:hi]) / l_.clamp_min(1e-300)
            o = torch.where(l_ > 0, o, torch.zeros_like(o))
            lse = torch.where(l_ > 0, m + torch.log2(l_.clamp_min(1e-300)), torch.full_like(l_, EMPTY_LSE))
            o_parts.append(o)
            l_parts.append(lse)
        lse = torch.stack(l_parts)  # [S, QL, Hq, 1]
        w = torch.exp2(lse - lse.amax(0, keepdim=True))
        out[i] = (w * torch.stack(o_parts)).sum(0) / w.sum(0)
    return out.view(n, hq, d)
