"""PR0002: check the TurboQuant decode call's metadata before the Triton launch."""

from __future__ import annotations

from collections.abc import Callable

from . import argument, wraps_original

# Parameter positions of vLLM 0.32.0's triton_turboquant_decode_attention
# (pinned by the patch's signature check).
_QUERY, _KV_CACHE, _BLOCK_TABLE, _SEQ_LENS, _PI = 0, 1, 2, 3, 4
_KEY_FP8 = 10


def check_decode_inputs(query, kv_cache, block_table, seq_lens, Pi, key_fp8: bool) -> None:
    """Raise ValueError for inputs the TurboQuant decode kernels would misread.

    The stage-1 kernel runs one program per (request, query head, split): it
    reads ``seq_lens[b]`` and ``block_table[b, :]`` as int32, maps query head
    ``h`` to KV head ``h // (Hq // Hk)``, and for MSE keys rotates the query
    by ``Pi`` (D x D). Wrong dtypes or short tensors are out-of-bounds reads;
    a head count that is not a multiple of the KV heads maps heads wrongly; a
    ``Pi`` that is not D x D means the rotation does not match the store's.
    Shape and dtype metadata only: no device synchronisation, safe while a
    CUDA graph is being captured.
    """
    import torch

    if query.dim() != 3 or kv_cache.dim() != 4:
        raise ValueError(
            f"TurboQuant decode: query {tuple(query.shape)} must be (B, Hq, D) and kv_cache "
            f"{tuple(kv_cache.shape)} (num_blocks, block_size, Hk, slot)"
        )
    batch, q_heads, head_dim = query.shape
    kv_heads = kv_cache.shape[2]
    if kv_heads <= 0 or q_heads % kv_heads != 0:
        raise ValueError(
            f"TurboQuant decode: {q_heads} query heads are not a multiple of the cache's {kv_heads} KV heads"
        )
    if block_table.dtype != torch.int32 or block_table.dim() != 2 or block_table.shape[0] < batch:
        raise ValueError(
            f"TurboQuant decode: block_table must be int32 (B={batch}, max_blocks), got "
            f"{block_table.dtype} {tuple(block_table.shape)}"
        )
    if seq_lens.dtype != torch.int32 or seq_lens.dim() != 1 or seq_lens.shape[0] < batch:
        raise ValueError(
            f"TurboQuant decode: seq_lens must be int32 with {batch} entries, got "
            f"{seq_lens.dtype} {tuple(seq_lens.shape)}"
        )
    if not key_fp8 and tuple(Pi.shape) != (head_dim, head_dim):
        raise ValueError(
            f"TurboQuant decode: rotation matrix is {tuple(Pi.shape)}, expected ({head_dim}, {head_dim}) "
            "for the MSE-key presets (a non-power-of-two head size has no Hadamard matrix; use "
            "turboquant_k8v4 for such models)"
        )


def wrap_turboquant_decode(original: Callable) -> Callable:
    """Wrapper factory for ``vllm.v1.attention.ops.triton_turboquant_decode:triton_turboquant_decode_attention``."""

    @wraps_original(original)
    def triton_turboquant_decode_attention(*args, **kwargs):
        check_decode_inputs(
            argument(args, kwargs, _QUERY, "query"),
            argument(args, kwargs, _KV_CACHE, "kv_cache"),
            argument(args, kwargs, _BLOCK_TABLE, "block_table"),
            argument(args, kwargs, _SEQ_LENS, "seq_lens"),
            argument(args, kwargs, _PI, "Pi"),
            bool(argument(args, kwargs, _KEY_FP8, "key_fp8", False)),
        )
        return original(*args, **kwargs)

    return triton_turboquant_decode_attention
