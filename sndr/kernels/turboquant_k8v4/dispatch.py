"""Backend choice for the k8v4 decode, and the memoised eager fast path.

* :func:`route`: which kernel a call of the vLLM entry (``vllm_entry.decode``,
  patch PK0001) runs: ``"cuda"`` where the CUDA kernels cover the config
  (k8v4, sm_89+, head dim 64/128, 256 on sm_90, page a multiple of 16,
  G = Hq/Hk <= 16, fp16/bf16 queries), ``"triton"`` only when
  ``SNDR_TQ_BACKEND=triton`` asks for it, else ``"vllm"`` (vLLM's own kernel).
  :func:`gate` is the same rule on plain metadata (tested on the CPU).
* :func:`decode_attention`: the public decode (the package's ``decode_attention``):
  CUDA where it takes the call, else the Triton kernels.
* the fast path (:func:`fast`): the first eager call of a shape runs the full
  checks and builds a ``cuda_decode.LaunchPlan``; later calls with the same
  metadata (shapes, strides, dtypes, device, buffers, split cap, backend
  variable) look the plan up with one dict access, check the pointer
  alignments, and launch from pre-packed argument buffers on torch's current
  raw stream: no tensor views, no allocation, no per-call ctypes objects, no
  device guard when the tensors' device is current.

This module imports both backends; ``kernels`` (Triton) and ``cuda_decode``
(CUDA) import neither this module nor each other at import time.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import NoReturn

import torch

from ... import env as sndr_env
from .. import _cudart
from . import cache_store, cuda_decode, kernels

__all__ = ["decode_attention", "route", "route_why", "gate", "gate_why", "fast", "remember", "reset"]

_ENV_DATA = getattr(os.environ, "_data", None)  # the mapping os.environ writes through to (POSIX)
_ENV_KEY: str | bytes | None  # os.environ's key as _data stores it (bytes on POSIX)
try:
    _ENV_KEY = os.environ.encodekey(sndr_env.TQ_BACKEND)
except AttributeError:  # pragma: no cover (non-POSIX os.environ)
    _ENV_DATA = None
    _ENV_KEY = None


def _no_cuda(*_args: object) -> NoReturn:
    """Stands in for torch's private CUDA calls on a torch built without them; :func:`fast` never gets
    there (a memo entry needs a successful CUDA call first)."""
    raise RuntimeError("this torch has no CUDA runtime calls")


_get_device: Callable[[], int] = getattr(torch._C, "_cuda_getDevice", None) or _no_cuda
_raw_stream: Callable[[int], int] = getattr(torch._C, "_cuda_getCurrentRawStream", None) or _no_cuda
_is_capturing: Callable[[], bool] = getattr(torch._C, "_cuda_isCurrentStreamCapturing", None) or _no_cuda

API: dict[tuple, tuple] = {}  # decode_attention calls
ENTRY: dict[tuple, tuple] = {}  # vllm_entry.decode calls


def _env_raw():
    """SNDR_TQ_BACKEND as stored (part of the fast-path key; ~0.1 us)."""
    if _ENV_DATA is not None:
        return _ENV_DATA.get(_ENV_KEY)
    return os.environ.get(sndr_env.TQ_BACKEND)  # pragma: no cover


def reset() -> None:
    """Forget every memoised fast path (after a policy change or a CUDA failure)."""
    API.clear()
    ENTRY.clear()


# ----------------------------------------------------------------------------- the gate


#: The GPU capabilities PK0001's benchmark measured (docs/bench-tq-decode-h200.md: H200, sm_90). On by
#: default (no SNDR_ENABLE_PK0001=1), the CUDA kernels run only there; an explicit opt-in runs them on
#: every capability they cover (sm_89+).
MEASURED_CAPABILITIES = ((9, 0),)

#: PK0002's verify kernel per shape (mtp_verify.block_plan): G (K + 1) > 16 query rows per KV head run wide
#: warps (up to 32 rows a warp) or the shared-tile CTA (several 16-row warps per KV head on one TMA-copied
#: tile, up to 16 warps per block) for these head dims; <= 16 rows, and head dim 256 (twice the accumulators:
#: 16 warps would spill), keep the one-warp-per-head kernel with one block per 16-row chunk.
VERIFY_SHARED_TILE_HEAD_DIMS = (64, 128)


def explicit_opt_in(patch_id: str = "PK0001") -> bool:
    """``SNDR_ENABLE_<patch_id>=1`` is set: the operator asked for the plugin, beyond its measured set."""
    try:
        return sndr_env.enable_override(patch_id) is True
    except Exception:  # noqa: BLE001 - a malformed value was refused at startup already; take the default scope
        return False


def gate_why(*, head_dim: int, page: int, hq: int, hk: int, qdtype: torch.dtype, key_fp8: bool,
             value_quant_bits: int, key_packed_size: int, capability: tuple[int, int] | None,
             backend: str = "auto", page_kernel_ok: bool = True, explicit: bool = True) -> tuple[str, str]:
    """(``"cuda"`` | ``"triton"`` | ``"vllm"``, why vLLM's kernel runs; "" otherwise) for a model config.

    ``capability`` None: not an NVIDIA GPU (ROCm, CPU). ``page_kernel_ok``: the
    cache can be copied by TMA (16-byte aligned rows, sm_90), which head dim
    256 needs. ``backend``: ``SNDR_TQ_BACKEND``; ``cuda`` raises ValueError where
    the CUDA kernels do not cover the config, ``triton`` runs sndr's Triton
    kernel on any k8v4 config it takes. ``explicit``: the plugin was enabled by
    ``SNDR_ENABLE_PK0001=1``; False (on by default) keeps the CUDA kernels to
    :data:`MEASURED_CAPABILITIES`.
    """
    if not key_fp8 or value_quant_bits != 4 or key_packed_size != head_dim:
        return "vllm", "not the k8v4 preset (fp8 keys, 4-bit values)"
    if head_dim & (head_dim - 1) or not 16 <= head_dim <= 256 or hk <= 0 or hq % hk:
        return "vllm", f"head dim {head_dim} / heads {hq}/{hk}"
    if capability is None:
        return "vllm", "not an NVIDIA CUDA device"
    if capability < (8, 9):
        return "vllm", f"sm_{capability[0]}{capability[1]} (fp8 e4m3 conversions need sm_89+)"
    if backend == "triton":
        if hq // hk <= 16 and qdtype in (torch.float16, torch.bfloat16):
            return "triton", ""
        return "vllm", f"SNDR_TQ_BACKEND=triton: group size {hq}/{hk} or query dtype {qdtype}"
    why = cuda_decode.config_problem(head_dim, page, hq, hk, qdtype, capability, page_kernel_ok)
    if why is None and not explicit and backend != "cuda" \
            and tuple(capability) not in MEASURED_CAPABILITIES:
        why = (f"sm_{capability[0]}{capability[1]} is outside the measured default set (sm_90); "
               "SNDR_ENABLE_PK0001=1 runs sndr's kernels there")
    if why is None:
        return "cuda", ""
    if backend == "cuda":
        raise ValueError(f"SNDR_TQ_BACKEND=cuda: {why}")
    return "vllm", why


def gate(**kw) -> str:
    """:func:`gate_why`'s verdict only (no tensors needed)."""
    return gate_why(**kw)[0]


def route_why(query: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor, seq_lens: torch.Tensor,
              key_packed_size: int, value_quant_bits: int, key_fp8: bool) -> tuple[str, str]:
    """:func:`gate_why` for the tensors of one vLLM-entry call, strides and alignment included."""
    if query.dim() != 3 or kv_cache.dim() != 4 or block_table.dim() != 2 or block_table.stride(1) != 1:
        return "vllm", "query/cache/block-table layout"
    backend = sndr_env.tq_backend()
    hq, d = query.shape[1], query.shape[2]
    if query.device.type != "cuda":  # the CPU interpreter (tests) runs the Triton kernels
        if not kernels.interpreting():
            return "vllm", f"a {query.device.type} tensor"
        return gate_why(head_dim=d, page=kv_cache.shape[1], hq=hq, hk=kv_cache.shape[2], qdtype=query.dtype,
                        key_fp8=key_fp8, value_quant_bits=value_quant_bits, key_packed_size=key_packed_size,
                        capability=(9, 0), backend="triton")
    cap = None if torch.version.hip is not None else cuda_decode._capability(cuda_decode.device_index(query))
    verdict, why = gate_why(head_dim=d, page=kv_cache.shape[1], hq=hq, hk=kv_cache.shape[2], qdtype=query.dtype,
                            key_fp8=key_fp8, value_quant_bits=value_quant_bits, key_packed_size=key_packed_size,
                            capability=cap, backend=backend,
                            page_kernel_ok=d != 256 or cuda_decode.page_kind_ok(kv_cache),
                            explicit=explicit_opt_in())
    if verdict == "triton":
        if kv_cache.dtype != torch.uint8 or kv_cache.stride(3) != 1 or any(kv_cache.stride(i) % 4 for i in range(3)):
            return "vllm", "cache rows not 4-byte aligned uint8"
        return verdict, ""
    if verdict == "cuda":
        why = cuda_decode.unsupported(query, kv_cache, block_table, seq_lens) or ""
        if why:
            if backend == "cuda":
                raise ValueError(f"SNDR_TQ_BACKEND=cuda: {why}")
            return "vllm", why
    return verdict, why


def route(query: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor, seq_lens: torch.Tensor,
          key_packed_size: int, value_quant_bits: int, key_fp8: bool) -> str:
    """:func:`route_why`'s verdict only."""
    return route_why(query, kv_cache, block_table, seq_lens, key_packed_size, value_quant_bits, key_fp8)[0]


# ----------------------------------------------------------------------------- fast path


def _key(query, kv_cache, block_table, seq_lens, out, lse, ws, max_splits, extra):
    return (query.shape, query.stride(), query.dtype, kv_cache.shape, kv_cache.stride(), kv_cache.dtype,
            block_table.shape, block_table.stride(), block_table.dtype, seq_lens.shape, seq_lens.stride(),
            seq_lens.dtype, out.shape, out.stride(), out.dtype,
            None if lse is None else lse.shape, None if lse is None else lse.stride(),
            None if lse is None else lse.dtype, None if ws is None else ws.shape,
            None if ws is None else ws.stride(), None if ws is None else ws.dtype,
            max_splits, extra, _env_raw(), query.get_device())


def fast(memo: dict, query, kv_cache, block_table, seq_lens, scale, out, lse, ws, max_splits, extra=()):
    """Launch a call whose metadata was seen before (see :func:`remember`); None: take the full path."""
    hit = memo.get(_key(query, kv_cache, block_table, seq_lens, out, lse, ws, max_splits, extra))
    if hit is None:
        return None
    lp, dev, kv_aligned, own, eager_mode = hit
    if _get_device() != dev:
        return None  # the full path launches under a device guard
    qp = query.data_ptr()
    kvp = kv_cache.data_ptr()
    if qp & 3 or ((kvp & 15) == 0) != kv_aligned:
        return None
    mode = lp.mode(True) if _is_capturing() else eager_mode
    if mode == "triton":
        return None
    stream = _raw_stream(dev)
    mo = lp.workspace(stream).data_ptr() if own else ws.data_ptr()
    if mo & 15:
        return None
    try:
        lp.launch(qp, kvp, block_table.data_ptr(), seq_lens.data_ptr(), out.data_ptr(),
                  0 if lse is None else lse.data_ptr(), mo, stream, scale, mode)
    except _cudart.CudaError as exc:
        cuda_decode.mark_broken(dev, str(exc).splitlines()[0])
        reset()
        return None
    return out


def remember(memo: dict, query, kv_cache, block_table, seq_lens, out, lse, ws, max_splits, extra=()) -> None:
    """After a successful eager CUDA call: let later calls with this metadata take :func:`fast`.

    Only calls :func:`fast` reproduces exactly: tensors on the current device,
    ``out`` / ``lse`` written in place (the CUDA merge's strides) and, when the
    caller's workspace is too small or absent, the plan's own.
    """
    bsz = query.shape[0]
    if bsz == 0 or query.get_device() != torch.cuda.current_device() or out.stride(2) != 1 \
            or (lse is not None and lse.stride(1) != 1):
        return
    lp = cuda_decode.launch_plan(query, kv_cache, block_table, out, lse, max_splits)
    if not lp.cuda_merge:
        return
    own = not (ws is not None and ws.dtype == torch.float32 and ws.is_contiguous() and ws.numel() >= lp.need)
    key = _key(query, kv_cache, block_table, seq_lens, out, lse, ws, max_splits, extra)
    memo[key] = (lp, query.get_device(), kv_cache.data_ptr() % 16 == 0, own, lp.mode(False))


# ----------------------------------------------------------------------------- public decode


def _capturing() -> bool:
    try:
        return torch.cuda.is_current_stream_capturing()
    except (RuntimeError, AssertionError):  # CPU-only torch
        return False


def _try_cuda(query, kv_cache, block_table, seq_lens, scale, out, lse, workspace, max_splits):
    """Run the CUDA backend if allowed and able; None: the caller runs Triton."""
    choice = sndr_env.tq_backend()
    if choice == "triton":
        return None
    why = cuda_decode.unsupported(query, kv_cache, block_table, seq_lens)
    if why is not None:
        if choice == "cuda":
            raise ValueError(f"SNDR_TQ_BACKEND=cuda: {why}")
        return None
    if not cuda_decode.planned(query, kv_cache) and _capturing():
        # building means NVRTC + module loading, which a CUDA-graph capture may refuse;
        # this shape records the Triton kernels (warm up eagerly first to get CUDA)
        if choice == "cuda":
            raise RuntimeError("SNDR_TQ_BACKEND=cuda: first call of this shape inside a CUDA-graph capture; "
                               "run it once eagerly before capturing")
        return None
    if out is None:
        out = torch.empty(query.shape, dtype=query.dtype, device=query.device)
    try:
        return cuda_decode.decode_attention(query, kv_cache, block_table, seq_lens, scale,
                                            out=out, lse=lse, workspace=workspace, max_splits=max_splits)
    except (_cudart.CudaUnavailable, _cudart.CudaError) as exc:
        if choice == "cuda":
            raise
        cuda_decode.mark_broken(cuda_decode.device_index(query), str(exc).splitlines()[0])
        reset()
        return None


def decode_attention(
    query: torch.Tensor,  # [B, Hq, D] fp16/bf16
    kv_cache: torch.Tensor,  # [blocks, page, Hk, slot] uint8
    block_table: torch.Tensor,  # [B, max_blocks] int32
    seq_lens: torch.Tensor,  # [B] int32
    scale: float,
    *,
    out: torch.Tensor | None = None,  # [B, Hq, D] query dtype (or float32)
    lse: torch.Tensor | None = None,  # [B, Hq] float32, natural log
    workspace: torch.Tensor | None = None,  # float32, >= workspace_numel(...)
    config: kernels.DecodeConfig | None = None,
    max_splits: int = 64,
) -> torch.Tensor:
    """Paged decode attention over a k8v4 cache. Returns ``out``.

    With no ``config``, the CUDA kernels (``cuda_decode``) run where they take
    the call and ``SNDR_TQ_BACKEND`` allows it; otherwise (or with a Triton
    ``config``) the Triton kernels.
    """
    if config is None and out is not None:
        done = fast(API, query, kv_cache, block_table, seq_lens, scale, out, lse, workspace, max_splits)
        if done is not None:
            return done
    hq, hk = query.shape[1], kv_cache.shape[2]
    if hq % hk:
        raise ValueError(f"Hq={hq} is not a multiple of Hk={hk}")
    cache_store.check_cache(kv_cache, query.shape[2], hk)
    if config is None and not kernels.interpreting() and query.device.type == "cuda":
        given = out
        done = _try_cuda(query, kv_cache, block_table, seq_lens, scale, out, lse, workspace, max_splits)
        if done is not None:
            if given is not None and not _capturing():
                remember(API, query, kv_cache, block_table, seq_lens, out, lse, workspace, max_splits)
            return done
    return kernels.triton_decode_attention(query, kv_cache, block_table, seq_lens, scale, out=out, lse=lse,
                                           workspace=workspace, config=config, max_splits=max_splits)
