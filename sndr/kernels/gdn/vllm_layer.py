"""The Qwen GDN layer's plain-decode step with the gated RMSNorm fused (PK0003).

vLLM 0.32.0's ``QwenGatedDeltaNetAttention._forward_core_fused_norm`` runs a
pure plain-decode batch (no prefill, no spec request) as the causal-conv
update, the packed recurrent decode and then a separate gated RMSNorm
(``_rms_norm_gated_cuda``). :func:`decode_fused_norm` runs the same conv
update (vLLM's own function, from the layer's module) and then
``vllm_entry.try_packed_decode_norm``: the decode and the norm in one launch.

It returns False, having done nothing, for every batch it does not take (no
metadata, prefills, spec requests, packed decode off, a norm vLLM configures
otherwise, a layout the kernel refuses); the caller then runs vLLM's method.
Once the conv update has run there is no way back, so every check is made
before it, on the pre-conv tensor (the conv writes its output in place, same
layout).
"""

from __future__ import annotations

import logging

import torch

from . import vllm_entry

LOG = logging.getLogger("sndr.kernels")


def _norm_ok(layer) -> str | None:
    norm = getattr(layer, "norm", None)
    if norm is None:
        return "layer has no norm"
    if getattr(norm, "bias", None) is not None:
        return "norm with a bias"
    gs = getattr(norm, "group_size", None)
    if gs is not None and gs != layer.head_v_dim:
        return f"norm group size {gs}"
    if not getattr(norm, "norm_before_gate", False):
        return "norm after gate"
    return None


def decode_fused_norm(layer, module_globals: dict, mixed_qkv: torch.Tensor, b: torch.Tensor, a: torch.Tensor,
                      output_gate: torch.Tensor, core_attn_out: torch.Tensor) -> bool:
    """Run a pure plain-decode batch with the norm fused; False (nothing done) where not taken."""
    fn = "packed decode + gated RMSNorm"
    md_all = module_globals["get_forward_context"]().attn_metadata
    md = md_all.get(layer.prefix) if isinstance(md_all, dict) else None
    if md is None:
        return False  # warm-up: vLLM's method handles it
    if not (md.spec_sequence_masks is None and md.num_prefills == 0 and md.num_decodes > 0):
        return False  # not a pure plain-decode batch: vLLM's path (the MTP op is routed separately)
    if not layer.enable_packed_recurrent_decode:
        return vllm_entry._refuse(fn, "VLLM_ENABLE_FLA_PACKED_RECURRENT_DECODE=0")
    why = _norm_ok(layer)
    if why:
        return vllm_entry._refuse(fn, why)
    n = md.num_actual_tokens
    idx = md.non_spec_state_indices_tensor[:n]
    ssm_state = layer.kv_cache[1]
    out = core_attn_out[:n]
    gate = output_gate[:n]
    x = mixed_qkv[:n]
    args = (a[:n], b[:n], layer.A_log, layer.dt_bias, layer.head_k_dim**-0.5, ssm_state, out, idx, gate,
            layer.norm.weight, layer.norm.eps, layer.norm.activation)
    if not vllm_entry.packed_decode_norm_ok(x, *args):
        return False  # refused (logged once): nothing has run
    conv_state = (layer.kv_cache[0] if module_globals["is_conv_state_dim_first"]()
                  else layer.kv_cache[0].transpose(-1, -2))
    conv_weights = layer.conv1d.weight.view(layer.conv1d.weight.size(0), layer.conv1d.weight.size(2))
    x = module_globals["causal_conv1d_update"](
        x, conv_state, conv_weights, layer.conv1d.bias, layer.activation, conv_state_indices=idx,
        validate_data=False)
    if vllm_entry.try_packed_decode_norm(x, *args, checked=True) is None:
        # the conv returned another layout than its input (never for vLLM's bf16 activations):
        # finish the batch exactly as vLLM's method would
        module_globals["fused_recurrent_gated_delta_rule_packed_decode"](
            mixed_qkv=x, a=a[:n], b=b[:n], A_log=layer.A_log, dt_bias=layer.dt_bias,
            scale=layer.head_k_dim**-0.5, initial_state=ssm_state, out=out.unsqueeze(1), ssm_state_indices=idx,
            use_qk_l2norm_in_kernel=True)
        layer._rms_norm_gated_cuda(out, gate, out)
    return True


def route_plain_decode(layer) -> None:
    """After vLLM's ``__init__``: send a layer without a spec config through the fused-norm forward.

    vLLM takes its fused-norm forward (``qwen_gdn_attention_core_fused_norm_packed``:
    core and gated RMSNorm inside one custom op, then ``out_proj``) only when a
    speculative config is set; without one the norm runs after the core op
    (``_output_projection``), where it cannot be fused into the decode. This
    sets ``enable_fused_gdn_spec_decode`` where vLLM itself accepted its fused
    CUDA decode for the layer (``gdn_decode_kernel == "cuda"``: BF16 model,
    K = V = 128, SiLU/sigmoid gate, non-interleaved layout) and the layer is not
    quantised (``quant_config is None``), so plain decode
    batches reach :func:`decode_fused_norm`; every other batch runs vLLM's
    ``_forward_core`` and its ``_rms_norm_gated_cuda`` (the same Triton norm as
    ``RMSNormGated.forward_cuda``). Only with ``SNDR_ENABLE_PK0003=1``: on by default
    the layer keeps the forward vLLM picked.
    """
    if getattr(layer, "enable_fused_gdn_spec_decode", True):
        return
    if not vllm_entry._explicit():
        # on by default PK0003 replaces kernels in its measured cells and never changes which forward vLLM
        # picks (this one would also carry prefill and mixed batches, which the benchmark does not measure)
        LOG.info("sndr PK0003: a layer without a spec config keeps vLLM's forward (SNDR_ENABLE_PK0003=1 routes "
                 "its plain decode through the fused norm)")
        return
    if getattr(layer, "gdn_decode_kernel", None) != "cuda" or getattr(layer, "gqa_interleaved_layout", True):
        return
    if not getattr(layer, "enable_packed_recurrent_decode", False) or _norm_ok(layer):
        return
    if getattr(layer, "quant_config", None) is not None:
        # vLLM's compile pass may fuse the separate norm with a quantised out_proj's input
        # quantisation (fuse_norm_quant); the fused-norm forward would give that up
        return
    layer.enable_fused_gdn_spec_decode = True
