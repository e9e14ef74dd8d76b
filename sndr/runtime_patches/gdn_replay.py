"""PK0004 (experimental, default off): the replayed spec verify routed into vLLM 0.32.0's Qwen GDN layer.

Two wrappers (``wrap = true``, ``chain = true``: stacked on PK0003's wrappers of the same
targets when both are enabled, PK0004 outermost, ``after = ["PK0003"]``):

* ``QwenGatedDeltaNetAttention.__init__``: records the facts of ``vllm_config`` the route
  decides on (``mamba_cache_mode``, a KV connector, ``max_num_seqs``, the spec token count);
* ``QwenGatedDeltaNetAttention._forward_core_fused_norm``: every batch goes through
  ``sndr.kernels.gdn.vllm_replay.forward_core_fused_norm``, which runs the replayed step for
  the pure spec batches it takes and, for every other batch, leaves replay for the batch's
  slots before calling the wrapped method (vLLM's, or PK0003's wrapper of it).

Outermost matters: PK0003's wrapper answers plain-decode batches itself, so a route inside
it would miss them. Nothing is imported until the first call.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from . import lazy_module, module_globals, wraps_original
from .gdn import layer_init_then

# no torch / triton: vLLM's own path runs
_route = lazy_module("sndr.kernels.gdn.vllm_replay", "PK0004", "GDN replay unavailable", "vLLM's snapshot path runs")


def wrap_forward_core_fused_norm(original: Callable) -> Callable:
    """Wrapper factory for ``...qwen_gdn_linear_attn:QwenGatedDeltaNetAttention._forward_core_fused_norm``."""
    vllm_globals = module_globals(original)  # through PK0003's wrapper below, when stacked

    @wraps_original(original)
    def _forward_core_fused_norm(self, mixed_qkv, b, a, output_gate, core_attn_out):
        route = _route()
        if not route:
            return original(self, mixed_qkv, b, a, output_gate, core_attn_out)
        return route.forward_core_fused_norm(self, vllm_globals, original, mixed_qkv, b, a, output_gate,
                                             core_attn_out)

    return _forward_core_fused_norm


def wrap_layer_init(original: Callable) -> Callable:
    """Wrapper factory for ``...qwen_gdn_linear_attn:QwenGatedDeltaNetAttention.__init__``."""

    def record(layer: Any, vllm_config: Any) -> None:
        route = _route()
        if route:
            route.record_config(layer, vllm_config)

    return layer_init_then(original, record)
