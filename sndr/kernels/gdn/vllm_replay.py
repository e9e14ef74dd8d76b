"""The route of the replayed spec verify into vLLM 0.32.0's Qwen GDN layer (PK0004, experimental, default off).

A wrapper of ``QwenGatedDeltaNetAttention._forward_core_fused_norm`` (the method a layer with a
spec config runs for **every** batch: ``forward_cuda`` -> ``qwen_gdn_attention_core_fused_norm_packed``
-> ``_forward_core_fused_norm_packed`` -> ``_forward_core_fused_norm``) that, per layer, holds one
:class:`~sndr.kernels.gdn.replay.GdnReplay` over the layer's SSM pool ``kv_cache[1]``:

* a pure spec-verify batch that vLLM would send to its fused CUDA op
  (``_can_use_fused_gdn_mtp_decode`` true, no prefills) and that :func:`replay.why_not` and the
  buffer's contract accept: vLLM's own causal-conv update (the same call, same arguments as
  ``_forward_core_decode_spec_fused_norm``), then ``GdnReplay.step`` instead of
  ``ops.fused_gdn_decode_post_conv_mtp``: the pool then holds each request's base state in its
  column-0 slot and the step's inputs wait in the side buffer;
* **every other batch** (mixed, prefill, plain decode, a spec batch refused), before vLLM's path
  (the wrapped method: vLLM's, or PK0003's wrapper of it) runs: ``materialize`` the column-0 slots
  of its spec rows and of its non-spec rows that read an initial state, ``invalidate`` those of
  non-spec rows that do not (a new request's first prompt chunk, ``has_initial_state`` false), so
  the pool holds exactly what vLLM's snapshot path would have left for every slot that batch reads.
  Each refusal is logged once per reason with its code (``replay.FALLBACKS``, registered in
  ``sndr/errors.py``).

Memory: the side buffer (``[slots, 2, TM, ...]``, about 6.3% of an fp32 pool and 12.7% of a bf16
one at the 35B-A3B shape with TM = 4) is allocated by ``torch.zeros`` on the pool's device at the
layer's first batch with metadata, **after** vLLM's memory profiling sized the KV cache: vLLM does
not see it. An operator enabling PK0004 lowers ``--gpu-memory-utilization`` by that share of the
GDN pools (logged with the byte count at allocation). A layer whose pool is re-bound (another
tensor) gets a new buffer; its old entries are dropped with the old pool.

Only CPU metadata decides (batch composition, ``has_initial_state`` is applied as a device mask):
no host synchronisation, so the replayed step and the leave-replay kernels run under CUDA graphs.
"""

from __future__ import annotations

import logging
import weakref
from dataclasses import dataclass

import torch

from . import replay as _replay

LOG = logging.getLogger("sndr.kernels")
_LOGGED: set[str] = set()


@dataclass(frozen=True)
class LayerConfig:
    """What the layer's ``vllm_config`` says about replay (recorded by the ``__init__`` wrapper)."""

    mamba_cache_mode: str
    kv_transfer: bool
    max_num_seqs: int
    num_spec: int


_CONFIG: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_REPLAYS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
#: counts of what the route did (tests read them): "replayed", "left" (a batch handed to vLLM's path
#: after leaving replay for its slots), "refused" (a refusal, by code in ``refused:<code>``)
STATS: dict[str, int] = {}


def _count(key: str) -> None:
    STATS[key] = STATS.get(key, 0) + 1


def fallback(code: str, detail: str) -> None:
    """Log once per reason code that a batch keeps vLLM's snapshot path."""
    assert code in _replay.FALLBACKS, code
    _count("refused:" + code)
    if code in _LOGGED:
        return
    _LOGGED.add(code)
    LOG.warning("sndr PK0004: [%s] %s (%s); vLLM's snapshot path runs (logged once per reason)", code,
                _replay.FALLBACKS[code], detail)


def record_config(layer, vllm_config) -> None:
    """From the layer's ``__init__``: the facts of ``vllm_config`` the route decides on."""
    cache = getattr(vllm_config, "cache_config", None)
    spec = getattr(vllm_config, "speculative_config", None)
    sched = getattr(vllm_config, "scheduler_config", None)
    mode = str(getattr(cache, "mamba_cache_mode", "none"))
    if getattr(cache, "use_replayssm", False):
        mode = "replayssm"  # vLLM's own ReplaySSM keeps no per-draft snapshot blocks: not this layout
    _CONFIG[layer] = LayerConfig(
        mamba_cache_mode=mode,
        kv_transfer=getattr(vllm_config, "kv_transfer_config", None) is not None,
        max_num_seqs=int(getattr(sched, "max_num_seqs", 0) or 0),
        num_spec=int(getattr(spec, "num_speculative_tokens", 0) or 0) if spec is not None else 0)


def layer_config(layer) -> LayerConfig | None:
    return _CONFIG.get(layer)


def replay_for(layer, act_dtype: torch.dtype) -> _replay.GdnReplay | None:
    """The layer's GdnReplay over its current SSM pool (made at the first call, sized with vLLM's
    ``max_num_seqs`` and ``num_speculative_tokens + 1`` columns); None where the layer has none."""
    cfg = _CONFIG.get(layer)
    if cfg is None or cfg.num_spec <= 0 or cfg.max_num_seqs <= 0:
        return None
    pool = layer.kv_cache[1]
    held = _REPLAYS.get(layer)
    if held is not None and held.state.data_ptr() == pool.data_ptr() and held.state.shape == pool.shape \
            and held.state.dtype == pool.dtype:
        # the same pool: its entries stay (activations of another dtype are refused by the step's contract,
        # and that batch then leaves replay like any other)
        return held
    if held is not None:
        LOG.info("sndr PK0004: layer %s: its state pool changed; replay entries of the old pool dropped",
                 getattr(layer, "prefix", "?"))
    rep = _replay.GdnReplay(pool, layer.num_k_heads // layer.tp_size, max_tokens=cfg.num_spec + 1,
                            max_requests=cfg.max_num_seqs, act_dtype=act_dtype)
    side = rep.side
    nbytes = sum(t.numel() * t.element_size() for t in (side.k, side.v, side.gb, side.meta, side.counter))
    LOG.warning("sndr PK0004: layer %s: replay side buffer of %.1f MiB allocated outside vLLM's memory "
                "profiling (%.1f%% of this layer's SSM pool; backend %s)", getattr(layer, "prefix", "?"),
                nbytes / 2**20, 100.0 * nbytes / max(pool.numel() * pool.element_size(), 1), rep.backend)
    _REPLAYS[layer] = rep
    return rep


def _metadata(layer, module_globals: dict):
    md_all = module_globals["get_forward_context"]().attn_metadata
    return md_all.get(layer.prefix) if isinstance(md_all, dict) else None


def _pure_spec(md) -> bool:
    return md.spec_sequence_masks is not None and md.num_prefills == 0 and md.num_decodes == 0


def _why_not_taken(layer, md, cfg: LayerConfig, rep, mixed_qkv, output_gate, core_attn_out) -> tuple[str, str] | None:
    """(code, detail) where this pure spec batch keeps vLLM's path, or None. Nothing has run."""
    if not (layer._can_use_fused_gdn_mtp_decode(md) and md.num_prefills == 0):
        return "gdn_replay_unsupported", "vLLM would not run its fused MTP op on this batch"
    n_req = md.num_spec_decodes
    n = md.num_actual_tokens
    idx = md.spec_state_indices_tensor[:n_req]
    state = layer.kv_cache[1]
    code = _replay.why_not(state, mixed_qkv[:n], idx, mamba_cache_mode=cfg.mamba_cache_mode,
                           kv_transfer=cfg.kv_transfer, max_tokens=rep.TM)
    if code:
        return code, f"layer {layer.prefix}"
    bad = rep._why_bad(mixed_qkv[:n], idx, state, output_gate[:n], core_attn_out[:n])
    if bad:
        return "gdn_replay_unsupported", bad
    if layer.norm.activation not in ("silu", "sigmoid"):  # the gates vLLM's op (and the kernel) take
        return "gdn_replay_unsupported", f"norm activation {layer.norm.activation}"
    return None


def leave(rep: _replay.GdnReplay, md) -> None:
    """Before vLLM's path runs a batch: the pool as vLLM's snapshot path left it, for every slot it reads.

    Spec rows (column 0 of ``spec_state_indices_tensor``) and non-spec rows with an initial state
    (``has_initial_state`` true, or no prefill in the batch) are materialised; non-spec rows without
    one (a new request's first chunk) are invalidated: their slot changed owner."""
    if md.spec_sequence_masks is not None and md.spec_state_indices_tensor is not None and md.num_spec_decodes:
        rep.materialize(md.spec_state_indices_tensor[: md.num_spec_decodes, 0])
    ns = md.non_spec_state_indices_tensor
    if ns is None or ns.numel() == 0:
        return
    ns = ns.reshape(-1)
    has_init = md.has_initial_state if md.num_prefills > 0 else None
    if has_init is None:
        rep.materialize(ns)
        return
    has_init = has_init.reshape(-1)[: ns.numel()]
    if has_init.numel() < ns.numel():  # never in vLLM's builder: rows beyond the mask are left alone
        ns = ns[: has_init.numel()]
    zero = torch.zeros_like(ns)
    rep.materialize(torch.where(has_init, ns, zero))
    rep.invalidate(torch.where(has_init, zero, ns))


def forward_core_fused_norm(layer, module_globals: dict, inner, mixed_qkv: torch.Tensor, b: torch.Tensor,
                            a: torch.Tensor, output_gate: torch.Tensor, core_attn_out: torch.Tensor):
    """The route: the replayed step for a pure spec batch it takes, else leave replay and run ``inner``."""
    md = _metadata(layer, module_globals)
    if md is None:  # warm-up / profiling: vLLM's method warms its prefill kernels, reads no pool slot
        return inner(layer, mixed_qkv, b, a, output_gate, core_attn_out)
    cfg = _CONFIG.get(layer)
    if cfg is None:
        fallback("gdn_replay_unsupported", "the layer's configuration was not recorded (PK0004's __init__ wrapper "
                                           "did not run)")
        return inner(layer, mixed_qkv, b, a, output_gate, core_attn_out)
    if cfg.num_spec <= 0:
        return inner(layer, mixed_qkv, b, a, output_gate, core_attn_out)  # no spec config: nothing to replay
    # fixed for the layer's life: never replayed, so no buffer is allocated and nothing is left to materialise
    if cfg.mamba_cache_mode != "none":
        fallback("gdn_replay_prefix_caching", f"mamba_cache_mode {cfg.mamba_cache_mode!r}")
        return inner(layer, mixed_qkv, b, a, output_gate, core_attn_out)
    if cfg.kv_transfer:
        fallback("gdn_replay_kv_transfer", "kv_transfer_config is set")
        return inner(layer, mixed_qkv, b, a, output_gate, core_attn_out)
    rep = replay_for(layer, mixed_qkv.dtype)
    if rep is None:
        fallback("gdn_replay_unsupported", f"no replay buffer for layer {layer.prefix}")
        return inner(layer, mixed_qkv, b, a, output_gate, core_attn_out)
    if _pure_spec(md):
        why = _why_not_taken(layer, md, cfg, rep, mixed_qkv, output_gate, core_attn_out)
        if why is None:
            if _step(layer, module_globals, rep, md, mixed_qkv, b, a, output_gate, core_attn_out):
                _count("replayed")
            return None
        fallback(*why)
    else:
        fallback("gdn_replay_mixed_batch", f"{md.num_prefills} prefills, {md.num_decodes} plain decodes, "
                                           f"{md.num_spec_decodes} spec rows")
    leave(rep, md)
    _count("left")
    return inner(layer, mixed_qkv, b, a, output_gate, core_attn_out)


def _step(layer, module_globals: dict, rep: _replay.GdnReplay, md, mixed_qkv, b, a, output_gate,
          core_attn_out) -> bool:
    """``_forward_core_decode_spec_fused_norm`` with ``GdnReplay.step`` in place of vLLM's fused MTP op
    (False: the conv's output could not be replayed and vLLM's op finished the batch)."""
    idx = md.spec_state_indices_tensor
    cu = md.spec_query_start_loc
    acc = md.num_accepted_tokens
    n_req = md.num_spec_decodes
    n = md.num_actual_tokens
    conv_state = (layer.kv_cache[0] if module_globals["is_conv_state_dim_first"]()
                  else layer.kv_cache[0].transpose(-1, -2))
    conv_weights = layer.conv1d.weight.view(layer.conv1d.weight.size(0), layer.conv1d.weight.size(2))
    x = module_globals["causal_conv1d_update"](
        mixed_qkv[:n], conv_state, conv_weights, layer.conv1d.bias, layer.activation,
        conv_state_indices=idx[:n_req, 0], num_accepted_tokens=acc[:n_req], query_start_loc=cu[: n_req + 1],
        max_query_len=idx.size(1), validate_data=False)
    if rep._why_bad(x, idx[:n_req], layer.kv_cache[1], output_gate[:n], core_attn_out[:n]):
        # the conv returned another layout than its input (never for vLLM's bf16 activations): there is no
        # way back from the conv, so finish the batch as vLLM's method would, on the snapshots
        fallback("gdn_replay_unsupported", "the causal-conv update returned another layout")
        rep.materialize(idx[:n_req, 0])
        layer._forward_core_decode_spec_post_conv_fused_norm(
            mixed_qkv=x, b=b[:n], a=a[:n], output_gate=output_gate[:n], core_attn_out=core_attn_out[:n],
            attn_metadata=md)
        return False
    rep.step(x, a[:n], b[:n], layer.A_log, layer.dt_bias, idx[:n_req], cu[: n_req + 1], acc[:n_req],
             layer.kv_cache[1], output_gate[:n], layer.norm.weight, core_attn_out[:n], layer.head_k_dim**-0.5,
             layer.layer_norm_epsilon, layer.norm.activation)
    return True
