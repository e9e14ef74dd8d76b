"""Drop-in replacement for vLLM 0.32.0's ``triton_turboquant_decode_attention``.

Patch PK0001 installs :func:`decode` in place of the name the TurboQuant
backend calls (``vllm.v1.attention.backends.turboquant_attn``). The signature
is vLLM's, parameter for parameter, so every call site binds unchanged.
k8v4 calls (fp8 keys, 4-bit values) that the CUDA kernels cover (sm_89+,
head dim 64/128, 256 on sm_90; pages of a multiple of 16 tokens; up to 16
query heads per KV head; see ``dispatch.gate``) run them; every other preset,
device or shape goes to vLLM's own function.

No ``from __future__ import annotations`` here: the signature must render
exactly as vLLM's does under ``inspect.signature``.
"""

from typing import Any

import torch

from . import canary, cuda_decode, dispatch, kernels

_FALLBACK: dict[str, Any] = {}
_LOGGED: set[str] = set()


def fallback(why: str) -> None:
    """Log, once per reason and process, that a call runs vLLM's kernel instead of sndr's."""
    if why not in _LOGGED:
        _LOGGED.add(why)
        from .cuda_decode import LOG

        LOG.warning("sndr PK0001: vLLM's TurboQuant decode runs for these calls: %s", why)


def _vllm_decode():
    if "fn" not in _FALLBACK:
        from vllm.v1.attention.ops.triton_turboquant_decode import triton_turboquant_decode_attention

        _FALLBACK["fn"] = triton_turboquant_decode_attention
    return _FALLBACK["fn"]


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
    """TurboQuant decode attention; k8v4 configs the CUDA kernels cover run them.

    Same contract as vLLM's: returns [B, Hq, D] in the query's dtype, written
    into ``output_buf`` when it fits; ``lse_buf`` gets the natural-log LSE.
    The split count depends only on the batch and head counts, so the launch
    grid is fixed per captured graph. Which kernel runs: ``dispatch.route``
    (everything the CUDA kernels do not cover runs vLLM's own function). A
    repeated eager call shape takes ``dispatch.fast``.
    """
    if output_buf is not None:
        done = dispatch.fast(dispatch.ENTRY, query, kv_cache, block_table, seq_lens, scale, output_buf, lse_buf,
                             mid_o_buf, max_num_kv_splits, (key_packed_size, value_quant_bits, key_fp8))
        if done is not None:
            return done
    how, why = dispatch.route_why(query, kv_cache, block_table, seq_lens, key_packed_size, value_quant_bits, key_fp8)
    if how != "vllm" and not canary.decode_ok(query, kv_cache, how):
        how, why = "vllm", ""  # the canary failed or was skipped here: logged and attested by sndr.kernels.canary
    if how == "vllm":
        if why:
            fallback(why)
        return _call_vllm(query, kv_cache, block_table, seq_lens, Pi, centroids, scale, mse_bits, key_packed_size,
                          value_quant_bits, key_fp8, norm_correction, PiT, mid_o_buf, output_buf, lse_buf,
                          buf_holder, max_num_kv_splits)
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
    splits = max(1, int(max_num_kv_splits))
    if how == "triton":
        return kernels.triton_decode_attention(query, kv_cache, block_table, seq_lens, scale, out=out, lse=lse,
                                               workspace=workspace, max_splits=splits)
    if out is None:
        out = torch.empty(query.shape, dtype=query.dtype, device=query.device)
    done = dispatch._try_cuda(query, kv_cache, block_table, seq_lens, scale, out, lse, workspace, splits)
    if done is None:  # first call of a shape inside a graph capture, or the CUDA backend just failed
        if not cuda_decode.planned(query, kv_cache) and dispatch._capturing():
            return kernels.triton_decode_attention(query, kv_cache, block_table, seq_lens, scale, out=out,
                                                   lse=lse, workspace=workspace, max_splits=splits)
        return _call_vllm(query, kv_cache, block_table, seq_lens, Pi, centroids, scale, mse_bits, key_packed_size,
                          value_quant_bits, key_fp8, norm_correction, PiT, mid_o_buf, output_buf, lse_buf,
                          buf_holder, max_num_kv_splits)
    exact = (output_buf is not None and tuple(output_buf.shape) == (bsz, hq, d) and out.data_ptr() == output_buf.data_ptr()
             and (lse_buf is None or (lse is not None and tuple(lse_buf.shape) == (bsz, hq))))
    if not exact:
        return done
    assert output_buf is not None  # exact: out is output_buf
    if not dispatch._capturing():
        dispatch.remember(dispatch.ENTRY, query, kv_cache, block_table, seq_lens, output_buf, lse_buf, mid_o_buf,
                          max_num_kv_splits, (key_packed_size, value_quant_bits, key_fp8))
    return output_buf  # as the fast path returns it


def _call_vllm(query, kv_cache, block_table, seq_lens, Pi, centroids, scale, mse_bits, key_packed_size,
               value_quant_bits, key_fp8, norm_correction, PiT, mid_o_buf, output_buf, lse_buf, buf_holder,
               max_num_kv_splits):
    return _vllm_decode()(
        query, kv_cache, block_table, seq_lens, Pi, centroids, scale, mse_bits,
        key_packed_size, value_quant_bits, key_fp8=key_fp8, norm_correction=norm_correction,
        PiT=PiT, mid_o_buf=mid_o_buf, output_buf=output_buf, lse_buf=lse_buf,
        buf_holder=buf_holder, max_num_kv_splits=max_num_kv_splits,
    )
