"""PK0003: vLLM 0.32.0's Qwen GDN decode kernels on sndr's fused GDN step.

Two wrappers (``wrap = true``), installed on the names the Qwen GDN layer
(``vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn``) calls:

* ``fused_recurrent_gated_delta_rule_packed_decode`` (plain decode,
  ``_forward_core_decode_non_spec``);
* ``fused_sigmoid_gating_delta_rule_update`` (spec verify; also vLLM's
  non-packed decode and the decode rows of a mixed prefill + decode batch).

and three on vLLM's default path (``VLLM_GDN_DECODE_KERNEL=cuda``), where
the gated RMSNorm is fused into the same launch:

* ``vllm._custom_ops.fused_gdn_decode_post_conv_mtp`` (pure spec-verify
  batches: the fused CUDA MTP op the layer calls through ``ops.``);
* ``QwenGatedDeltaNetAttention._forward_core_fused_norm`` (pure plain-decode
  batches: conv update, then packed decode + norm in one kernel);
* ``QwenGatedDeltaNetAttention.__init__`` (a layer without a spec config that
  vLLM's fused CUDA decode accepts takes vLLM's fused-norm forward, so its
  plain decode reaches the wrapper above).

Each wrapper has vLLM's parameter list, so the layer's keyword calls bind
unchanged, and hands the call to ``sndr.kernels.gdn.vllm_entry``; where that
does not take it (another state dtype, ROCm, no Triton, KDA gating, ...) it
calls vLLM's original, and the reason is logged once. Nothing is imported
until the first call, so installing the patch costs nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from . import lazy_module, module_globals, wraps_original

# no torch / triton: vLLM's own kernels run
_entry = lazy_module("sndr.kernels.gdn.vllm_entry", "PK0003", "GDN kernels unavailable", "vLLM's own kernels run")


def wrap_packed_decode(original: Callable) -> Callable:
    """Wrapper factory for ``...qwen_gdn_linear_attn:fused_recurrent_gated_delta_rule_packed_decode``."""

    @wraps_original(original)
    def fused_recurrent_gated_delta_rule_packed_decode(
        mixed_qkv, a, b, A_log, dt_bias, scale, initial_state, out, ssm_state_indices,
        use_qk_l2norm_in_kernel=False,
    ):
        entry = _entry()
        if entry:
            res = entry.try_packed_decode(mixed_qkv, a, b, A_log, dt_bias, scale, initial_state, out,
                                          ssm_state_indices, use_qk_l2norm_in_kernel)
            if res is not None:
                return res
        return original(mixed_qkv, a, b, A_log, dt_bias, scale, initial_state, out, ssm_state_indices,
                        use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel)

    return fused_recurrent_gated_delta_rule_packed_decode


def wrap_sigmoid_gating_update(original: Callable) -> Callable:
    """Wrapper factory for ``...qwen_gdn_linear_attn:fused_sigmoid_gating_delta_rule_update``."""

    @wraps_original(original)
    def fused_sigmoid_gating_delta_rule_update(
        A_log, a, b, dt_bias, q, k, v, beta=1.0, threshold=20.0, scale=None, initial_state=None,
        inplace_final_state=True, cu_seqlens=None, ssm_state_indices=None, num_accepted_tokens=None,
        use_qk_l2norm_in_kernel=False, is_kda=False,
    ):
        entry = _entry()
        if entry:
            res = entry.try_sigmoid_gating_update(
                A_log, a, b, dt_bias, q, k, v, beta, threshold, scale, initial_state, inplace_final_state,
                cu_seqlens, ssm_state_indices, num_accepted_tokens, use_qk_l2norm_in_kernel, is_kda)
            if res is not None:
                return res
        return original(
            A_log=A_log, a=a, b=b, dt_bias=dt_bias, q=q, k=k, v=v, beta=beta, threshold=threshold,
            scale=scale, initial_state=initial_state, inplace_final_state=inplace_final_state,
            cu_seqlens=cu_seqlens, ssm_state_indices=ssm_state_indices,
            num_accepted_tokens=num_accepted_tokens, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
            is_kda=is_kda,
        )

    return fused_sigmoid_gating_delta_rule_update


def wrap_post_conv_mtp(original: Callable) -> Callable:
    """Wrapper factory for ``vllm._custom_ops:fused_gdn_decode_post_conv_mtp``."""

    @wraps_original(original)
    def fused_gdn_decode_post_conv_mtp(
        mixed_qkv, a, b, A_log, dt_bias, state_indices, cu_seqlens, num_accepted_tokens, state, output_gate,
        norm_weight, out=None, scale=128**-0.5, norm_eps=1e-5, output_gate_activation="silu",
    ):
        entry = _entry()
        if entry:
            res = entry.try_post_conv_mtp(mixed_qkv, a, b, A_log, dt_bias, state_indices, cu_seqlens,
                                          num_accepted_tokens, state, output_gate, norm_weight, out, scale, norm_eps,
                                          output_gate_activation)
            if res is not None:
                return res
        return original(mixed_qkv, a, b, A_log, dt_bias, state_indices, cu_seqlens, num_accepted_tokens, state,
                        output_gate, norm_weight, out=out, scale=scale, norm_eps=norm_eps,
                        output_gate_activation=output_gate_activation)

    return fused_gdn_decode_post_conv_mtp


_layer_glue = lazy_module("sndr.kernels.gdn.vllm_layer", "PK0003", "GDN kernels unavailable",
                          "vLLM's own kernels run")


def wrap_forward_core_fused_norm(original: Callable) -> Callable:
    """Wrapper factory for ``...qwen_gdn_linear_attn:QwenGatedDeltaNetAttention._forward_core_fused_norm``."""
    vllm_globals = module_globals(original)

    @wraps_original(original)
    def _forward_core_fused_norm(self, mixed_qkv, b, a, output_gate, core_attn_out):
        glue = _layer_glue()
        if glue and glue.decode_fused_norm(self, vllm_globals, mixed_qkv, b, a, output_gate, core_attn_out):
            return None
        return original(self, mixed_qkv, b, a, output_gate, core_attn_out)

    return _forward_core_fused_norm


def layer_init_then(original: Callable, after: Callable[[Any, Any], None]) -> Callable:
    """``QwenGatedDeltaNetAttention.__init__`` (vLLM 0.32.0's signature) wrapped to call
    ``after(layer, vllm_config)`` once vLLM's own ``__init__`` has built the layer (PK0003 and PK0004)."""

    @wraps_original(original)
    def __init__(self, config, vllm_config, prefix="", gqa_interleaved_layout=False, reduce_results=True):
        original(self, config, vllm_config, prefix=prefix, gqa_interleaved_layout=gqa_interleaved_layout,
                 reduce_results=reduce_results)
        after(self, vllm_config)

    return __init__


def wrap_layer_init(original: Callable) -> Callable:
    """Wrapper factory for ``...qwen_gdn_linear_attn:QwenGatedDeltaNetAttention.__init__``."""

    def route(layer: Any, _vllm_config: Any) -> None:
        glue = _layer_glue()
        if glue:
            glue.route_plain_decode(layer)

    return layer_init_then(original, route)
