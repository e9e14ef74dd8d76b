"""TurboQuant k8v4 KV cache (fp8 keys, 4-bit values): store and paged decode.

Public surface:

* ``store(key, value, kv_cache, slot_mapping)``: Triton store, byte-identical
  to vLLM 0.32.0's ``triton_turboquant_store`` for k8v4;
* ``decode_attention(query, kv_cache, block_table, seq_lens, scale, ...)``:
  GQA-grouped split-KV decode, CUDA-graph capturable: the CUDA kernels of
  ``decode_k8v4.cu`` (built by NVRTC, ``cuda_decode``) where they take the
  call, else Triton (``SNDR_TQ_BACKEND``);
* ``decode(...)``: drop-in for vLLM 0.32.0's
  ``triton_turboquant_decode_attention`` (same signature); other presets and
  unsupported shapes go to vLLM's own function. Patch PK0001 installs it.
* ``verify_attention(...)``: the multi-query (speculative verify) decode: each
  KV tile read once for all (K+1)*G query rows (``mtp_verify``, patch PK0002);
* ``reference``: pure-PyTorch pack/unpack/store/decode.

torch and triton load on first attribute access, so importing this package
costs nothing where they are absent.
"""

from __future__ import annotations

from .. import lazy_attrs
from ._layout import Layout, slot_size_aligned

__all__ = ["Layout", "slot_size_aligned", "store", "decode_attention", "decode", "DecodeConfig", "reference",
           "verify_attention"]

_LAZY: dict[str, str | None] = {
    "store": ".cache_store",
    "decode_attention": ".dispatch",
    "DecodeConfig": ".kernels",
    "decode": ".vllm_entry",
    "verify_attention": ".mtp_verify",
    "reference": None,
}


__getattr__ = lazy_attrs(__name__, _LAZY)
