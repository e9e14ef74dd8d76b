"""PK0002: uniform speculative-verify batches of the TurboQuant backend as decodes.

vLLM 0.32.0's ``TurboQuantMetadataBuilder`` keeps ``reorder_batch_threshold``
at 1 (``supports_spec_as_decode=False``), so a verify step of MTP / draft
speculative decoding (``K + 1`` query tokens per request) is a "prefill":
``TurboQuantAttentionImpl._prefill_attention`` loops over the requests on the
host and runs vLLM's decode kernel on ``K + 1`` synthetic rows per request.

Two wrappers (``wrap = true``, installed by sndr's runtime patcher):

* :func:`wrap_build` (``TurboQuantMetadataBuilder.build``): after vLLM's own
  build, a batch in which every request has exactly ``K + 1`` query tokens
  (padding requests of a CUDA graph: 0), none of them still prefilling its
  prompt, is re-labelled a decode batch (``is_prefill = False``, all requests
  decodes) and marked with ``sndr_verify_len = K + 1``. Only CPU tensors are
  read (``query_start_loc_cpu``, ``is_prefilling``): no device sync. Every
  other batch is returned exactly as vLLM built it. The batch order is
  vLLM's: the reorder threshold stays 1.
* :func:`wrap_forward` (``TurboQuantAttentionImpl.forward``): a marked batch
  runs :func:`sndr.kernels.turboquant_k8v4.mtp_verify.verify_attention` (one
  KV read per request, fixed grid, no host sync: vLLM captures it in its FULL
  decode graphs, which it already keys on uniform ``K + 1`` batches because
  the builder declares ``AttentionCGSupport.UNIFORM_BATCH``). Unmarked
  batches call vLLM's forward unchanged.

Where it applies (else both wrappers are pass-throughs): a speculative config
with ``1 <= num_speculative_tokens <= 15`` (any method: the verify attention
does not depend on how drafts were made; methods with variable draft lengths
simply produce non-uniform batches, which stay on vLLM's path),
``--kv-cache-dtype turboquant_k8v4``, a CUDA device of sm_89+ (sm_90 runs the
verify kernel, sm_89 PK0001's decode on synthetic rows), no decode context
parallelism, and an implementation using the AoS cache layout (not FlyDSL's
SoA store, which is ROCm-only).

Nothing here imports torch or vLLM at import time.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable

from . import wraps_original

MARK = "sndr_verify_len"
_STATE = "_sndr_pk0002_ql"
LOG = logging.getLogger("sndr.kernels")
MAX_QL = 16
#: The GPU capabilities PK0002's benchmark measured (docs/bench-mtp-verify-h200.md: H200, sm_90). On by
#: default, verify batches are routed only there; SNDR_ENABLE_PK0002=1 routes them on sm_89+ too.
MEASURED_CAPABILITIES = ((9, 0),)


def verify_len(builder) -> int:
    """K + 1 where this builder's batches may be routed, else 0 (computed once per builder)."""
    ql = builder.__dict__.get(_STATE)
    if ql is None:
        try:
            ql = _applicable(builder)
        except Exception as exc:  # noqa: BLE001 - a config we cannot read is a config we do not route
            LOG.warning("sndr PK0002: not routing verify batches (%s: %s)", type(exc).__name__, exc)
            ql = 0
        builder.__dict__[_STATE] = ql
    return ql


_LOGGED: set[str] = set()


def _fallback(why: str) -> int:
    """Log, once per reason and process, that verify batches keep vLLM's path; return 0 (not routed)."""
    if why not in _LOGGED:
        _LOGGED.add(why)
        LOG.warning("sndr PK0002: verify batches keep vLLM's path: %s", why)
    return 0


def _applicable(builder) -> int:
    cfg = builder.vllm_config
    spec = getattr(cfg, "speculative_config", None)
    k = getattr(spec, "num_speculative_tokens", None) if spec is not None else None
    if not k:
        return 0  # no speculative decoding: nothing to route
    if not 1 <= int(k) <= MAX_QL - 1:
        return _fallback(f"num_speculative_tokens = {k} (1..{MAX_QL - 1} covered)")
    dtype = str(getattr(cfg.cache_config, "cache_dtype", ""))
    if dtype != "turboquant_k8v4":
        return _fallback(f"--kv-cache-dtype {dtype} (turboquant_k8v4 only)")
    par = cfg.parallel_config
    if getattr(par, "decode_context_parallel_size", 1) > 1 or getattr(par, "prefill_context_parallel_size", 1) > 1:
        return _fallback("decode or prefill context parallelism")
    import torch

    from ..kernels import _cudart  # (the one home of the device facts and the device gate)

    device = torch.device(builder.device)
    why = _cudart.device_refusal(device, (8, 9), "{sm} (sm_89+ covered)")
    if why:
        return _fallback(f"device {device}: {why}")
    idx = _cudart.device_index(device)
    cap = _cudart.capability(idx)
    if cap not in MEASURED_CAPABILITIES and not _explicit():
        return _fallback(f"sm_{cap[0]}{cap[1]} is outside the measured default set (sm_90); "
                         "SNDR_ENABLE_PK0002=1 routes verify batches there")
    _prepare(builder, cfg, int(k), idx)
    if not _canary(builder, cfg, int(k), idx):
        return 0  # canary_failed / canary_skipped: logged and attested by sndr.kernels.canary
    return int(k) + 1


def _explicit() -> bool:
    from .. import env

    try:
        return env.enable_override("PK0002") is True
    except Exception:  # noqa: BLE001 - refused at startup already
        return False


def _canary(builder, cfg, k: int, idx: int) -> bool:
    """PK0002's first-use canary for this model shape (sndr.kernels.turboquant_k8v4.canary.verify_ok)."""
    from ..kernels.turboquant_k8v4 import canary

    mc = cfg.model_config
    spec = builder.kv_cache_spec
    return canary.verify_ok(idx, mc.dtype, mc.get_num_attention_heads(cfg.parallel_config), spec.num_kv_heads,
                            mc.get_head_size(), spec.block_size, k)


def _prepare(builder, cfg, k: int, idx: int) -> None:
    """Build the verify kernel now, outside any CUDA-graph capture (best effort)."""
    try:
        from ..kernels.turboquant_k8v4 import mtp_verify

        mc = cfg.model_config
        spec = builder.kv_cache_spec
        mtp_verify.prepare(idx, mc.dtype, mc.get_num_attention_heads(cfg.parallel_config), spec.num_kv_heads,
                           mc.get_head_size(), spec.block_size, k)
    except Exception as exc:  # noqa: BLE001 - the first eager call builds it instead
        LOG.info("sndr PK0002: verify kernel not prebuilt (%s: %s)", type(exc).__name__, exc)


def uniform_verify(cam, ql: int) -> bool:
    """Every request has ``ql`` query tokens (CUDA-graph padding requests: 0) and none is prefilling.

    On Python ints (one ``tolist()`` of the CPU tensors): this runs on the host every step, and a
    handful of small tensor ops cost tens of microseconds (docs/bench-tq-layer-h200.md)."""
    n_tok, n_req = cam.num_actual_tokens, cam.num_reqs
    if cam.max_query_len != ql or n_tok <= 0 or n_tok % ql:
        return False
    qsl = cam.query_start_loc_cpu
    if qsl is None:
        return False
    starts = qsl[: n_req + 1].tolist()
    lens = [b - a for a, b in zip(starts, starts[1:], strict=False)]
    if any(n != ql and n != 0 for n in lens):
        return False
    # num_actual_tokens may include CUDA-graph padding: the padding requests (length 0, at the
    # end, seq_len 0) then own the rows past the real ones, ql each
    nz = sum(1 for n in lens if n)
    real = nz * ql
    if real == 0 or not real <= n_tok <= n_req * ql:
        return False
    # padding rows sit at the end of the batch (a later real request would be misplaced)
    if 0 in lens[:nz]:
        return False
    pre = getattr(cam, "is_prefilling", None)
    if pre is not None and any(pre[:n_req].tolist()):
        return False
    return True


def wrap_build(original: Callable) -> Callable:
    """Wrapper factory for ``TurboQuantMetadataBuilder.build``."""

    @wraps_original(original)
    def build(self, common_prefix_len, common_attn_metadata, fast_build=False):
        md = original(self, common_prefix_len, common_attn_metadata, fast_build)
        ql = verify_len(self)
        if ql > 1 and md.is_prefill and uniform_verify(common_attn_metadata, ql):
            md.is_prefill = False
            md.num_decodes = common_attn_metadata.num_reqs
            md.num_decode_tokens = common_attn_metadata.num_actual_tokens
            setattr(md, MARK, ql)
        return md

    return build


def _upstream_metadata(md):
    """The metadata vLLM's own build produced for a batch this patch marked."""
    out = dataclasses.replace(md, is_prefill=True, num_decodes=0, num_decode_tokens=0)
    out.__dict__.pop(MARK, None)
    return out


def wrap_forward(original: Callable) -> Callable:
    """Wrapper factory for ``TurboQuantAttentionImpl.forward``."""

    @wraps_original(original)
    def forward(self, layer, query, key, value, kv_cache, attn_metadata, output=None, output_scale=None,
                output_block_scale=None):
        ql = getattr(attn_metadata, MARK, 0) if attn_metadata is not None else 0
        if not ql:
            return original(self, layer, query, key, value, kv_cache, attn_metadata, output, output_scale,
                            output_block_scale)
        cfg = self.tq_config
        if (getattr(self, "_soa_store", False) or not cfg.key_fp8 or cfg.effective_value_quant_bits != 4
                or output_scale is not None or output_block_scale is not None):
            return original(self, layer, query, key, value, kv_cache, _upstream_metadata(attn_metadata), output,
                            output_scale, output_block_scale)
        return verify_forward(self, query, kv_cache, attn_metadata, output, ql)

    return forward


def verify_forward(impl, query, kv_cache, md, output, ql: int):
    """The decode branch of vLLM's forward for a marked verify batch."""
    import torch

    from ..kernels.turboquant_k8v4 import mtp_verify

    num_tokens = query.shape[0]
    hq, d = impl.num_heads, impl.head_size
    if output is None:
        output = torch.zeros(num_tokens, hq * d, dtype=query.dtype, device=query.device)
    n = md.num_actual_tokens
    if n <= 0:
        return output.fill_(0)
    kv = kv_cache.transpose(1, 2)  # (B, H, N, C) -> (B, N, H, C), as vLLM's forward
    q = query[:n].view(n, hq, d)
    b = n // ql
    direct = None
    if output.dtype == q.dtype and output.is_contiguous() and output.numel() >= n * hq * d:
        direct = output.view(-1)[: n * hq * d].view(n, hq, d)
    out = mtp_verify.verify_attention(q, kv, md.block_table[:b], md.seq_lens[:b], impl.scale, ql - 1,
                                      out=direct, max_splits=max(32, int(getattr(impl, "max_num_kv_splits", 32))))
    if direct is None:
        if output.ndim == 3:
            output[:n] = out.to(output.dtype)
        else:
            output[:n] = out.reshape(n, -1).to(output.dtype)
    return output
