"""PK0003: vLLM 0.32.0's Qwen GDN decode kernels on sndr's fused GDN step.

Two wrappers (``wrap = true``), installed on the names the Qwen GDN layer
(``vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn``) calls:

* ``fused_recurrent_gated_delta_rule_packed_decode`` (plain decode,
  ``_forward_core_decode_non_spec``);
* ``fused_sigmoid_gating_delta_rule_update`` (spec verify; also vLLM's
  non-packed decode and the decode rows of a mixed prefill + decode batch).

Each wrapper has vLLM's parameter list, so the layer's keyword calls bind
unchanged, and hands the call to ``sndr.kernels.gdn.vllm_entry``; where that
does not take it (another state dtype, ROCm, no Triton, KDA gating, ...) it
calls vLLM's original, and the reason is logged once. Nothing is imported
until the first call, so installing the patch costs nothing.
"""

from __future__ import annotations

from collections.abc import Callable

from . import wraps_original

_ENTRY: dict[str, object] = {}


def _entry():
    mod = _ENTRY.get("m")
    if mod is None:
        try:
            from sndr.kernels.gdn import vllm_entry as mod
        except ImportError as exc:  # no torch / triton: vLLM's own kernels run
            import logging

            logging.getLogger("sndr.kernels").warning(
                "sndr PK0003: GDN kernels unavailable (%s); vLLM's own kernels run (logged once)", exc)
            mod = False
        _ENTRY["m"] = mod
    return mod


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
