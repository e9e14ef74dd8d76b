"""Drop-in replacement for vLLM 0.32.0's ``triton_turboquant_decode_attention``.

Patch PK0001 installs :func:`decode` in place of the name the TurboQuant
backend calls (``vllm.v1.attention.backends.turboquant_attn``). The signature
is vLLM's, parameter for parameter, so every call site binds unchanged.
k8v4 calls (fp8 keys, 4-bit values) on an sm_89+ GPU run this package's
kernels; every other preset, device or shape goes to vLLM's own function.

No ``from __future__ import annotations`` here: the signature must render
exactly as vLLM's does under ``inspect.signature``.
"""

from typing import Any

import torch

from . import kernels

_FALLBACK: dict[str, Any] = {}


def _vllm_decode():
    if "fn" not in _FALLBACK:
        from vllm.v1.attention.ops.triton_turboquant_decode import triton_turboquant_decode_attention

        _FALLBACK["fn"] = triton_turboquant_decode_attention
    return _FALLBACK["fn"]


_CAPABLE: dict[int, bool] = {}


def _device_ok(t: torch.Tensor) -> bool:
    if t.device.type != "cuda":
        return kernels.interpreting()
    idx = t.device.index if t.device.index is not None else torch.cuda.current_device()
    if idx not in _CAPABLE:
        # fp8 e4nv needs sm_89+; ROCm uses other fp8 encodings
        _CAPABLE[idx] = torch.version.hip is None and torch.cuda.get_device_capability(idx) >= (8, 9)
    return _CAPABLE[idx]


def supported(
    query: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor,
    key_packed_size: int, value_quant_bits: int, key_fp8: bool,
) -> bool:
    """Whether this package's kernels take the call (else vLLM's own run)."""
    if not key_fp8 or value_quant_bits != 4 or query.dim() != 3 or kv_cache.dim() != 4:
        return False
    if block_table.dim() != 2 or block_table.stride(1) != 1:
        return False
    d = query.shape[2]
    if key_packed_size != d or d & (d - 1) or not 16 <= d <= 256:
        return False
    if query.dtype not in (torch.float16, torch.bfloat16) or query.stride(2) != 1:
        return False
    hq, hk = query.shape[1], kv_cache.shape[2]
    if hk == 0 or hq % hk or hq // hk > 16:  # G up to 16 checked on the GPU
        return False
    if kv_cache.dtype != torch.uint8 or kv_cache.stride(3) != 1 or any(kv_cache.stride(i) % 4 for i in range(3)):
        return False
    return _device_ok(query)


def decode(
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    Pi: torch.Tensor,
    centroids: torch.Tensor,
    scale: float,
    mse_bits: int,
    key_packed_size: int,
    value_quant_bits: int,
    key_fp8: bool = False,
    norm_correction: bool = False,
    PiT: torch.Tensor | None = None,
    mid_o_buf: torch.Tensor | None = None,
    output_buf: torch.Tensor | None = None,
    lse_buf: torch.Tensor | None = None,
    buf_holder: Any = None,
    max_num_kv_splits: int = 32,
) -> torch.Tensor:
    """TurboQuant decode attention; k8v4 runs the GQA split-KV kernels.

    Same contract as vLLM's: returns [B, Hq, D] in the query's dtype, written
    into ``output_buf`` when it fits; ``lse_buf`` gets the natural-log LSE.
    The split count is at most ``max_num_kv_splits`` and depends only on the
    batch and head counts, so the launch grid is fixed per captured graph.
    """
    if not supported(query, kv_cache, block_table, key_packed_size, value_quant_bits, key_fp8):
        return _vllm_decode()(
            query, kv_cache, block_table, seq_lens, Pi, centroids, scale, mse_bits,
            key_packed_size, value_quant_bits, key_fp8=key_fp8, norm_correction=norm_correction,
            PiT=PiT, mid_o_buf=mid_o_buf, output_buf=output_buf, lse_buf=lse_buf,
            buf_holder=buf_holder, max_num_kv_splits=max_num_kv_splits,
        )
    bsz, hq, d = query.shape
    out = None
    if output_buf is not None and output_buf.shape[0] >= bsz and output_buf.dtype == query.dtype:
        out = output_buf[:bsz, :hq, :d]
        if out.stride(2) != 1:
            out = None
    lse = None
    if lse_buf is not None and lse_buf.shape[0] >= bsz and lse_buf.dtype == torch.float32:
        lse = lse_buf[:bsz, :hq]
        if lse.stride(1) != 1:
            lse = None
    # vLLM sizes mid_o_buf as [B, Hq, max_num_kv_splits, D + 1] float32: enough
    # for our partials whenever we use no more splits than that.
    workspace = None
    if mid_o_buf is not None and mid_o_buf.dtype == torch.float32 and mid_o_buf.is_contiguous():
        workspace = mid_o_buf.view(-1)
    result = kernels.decode_attention(
        query, kv_cache, block_table, seq_lens, scale,
        out=out, lse=lse, workspace=workspace,
        max_splits=max(1, int(max_num_kv_splits)),
    )
    return result

