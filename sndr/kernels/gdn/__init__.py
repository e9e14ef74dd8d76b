"""Gated DeltaNet (GDN) decode and spec-verify step: one fused Triton kernel (and, for vLLM's default path,
a CUDA kernel: ``step.cu`` / ``cuda_step``, routed per measured cell).

Public surface:

* ``gdn_step(...)`` (``kernels``): the fused step on a state pool
  ``[slots, HV, V, K]`` (float32 or bfloat16) addressed through
  ``ssm_state_indices``, T >= 1 tokens per sequence with per-token state
  snapshots and ``num_accepted_tokens``, gating fused (``A_log``,
  ``dt_bias``, raw ``a``, ``b``), q/k L2-normalised, fp32 accumulation, the
  V dimension split across programs; CUDA-graph capturable;
* ``try_packed_decode`` / ``try_sigmoid_gating_update`` (``vllm_entry``):
  vLLM 0.32.0's ``fused_recurrent_gated_delta_rule_packed_decode`` and
  ``fused_sigmoid_gating_delta_rule_update`` on that kernel (same arguments,
  same results), or ``None`` where it does not take the call. Patch PK0003
  routes vLLM's Qwen GDN layer through them;
* ``try_post_conv_mtp`` / ``try_packed_decode_norm`` (``vllm_entry``): vLLM's
  default path (its fused CUDA MTP op; the packed decode + gated RMSNorm) on the
  same kernel with the norm fused, or on the CUDA step (``cuda_step``: ``step.cu``
  compiled by NVRTC) where it measured faster, taken only in the measured winning
  cells (``routing``) and after the first-use canary (``canary``);
* ``reference``: the naive recurrence in PyTorch (float32 / float64).

torch and triton load on first attribute access, so importing this package
costs nothing where they are absent.
"""

from __future__ import annotations

from .. import lazy_attrs

__all__ = ["gdn_step", "StepConfig", "pick_config", "try_packed_decode", "try_sigmoid_gating_update", "reference"]

_LAZY = {
    "gdn_step": ".kernels",
    "StepConfig": ".kernels",
    "pick_config": ".kernels",
    "try_packed_decode": ".vllm_entry",
    "try_sigmoid_gating_update": ".vllm_entry",
    "reference": None,
}


__getattr__ = lazy_attrs(__name__, _LAZY)
