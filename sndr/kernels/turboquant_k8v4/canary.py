"""The canaries of PK0001 (k8v4 decode) and PK0002 (speculative verify): :mod:`sndr.kernels.canary`.

Each runs a small fixed problem of the deployment's own shape (head dim, query
and KV heads, page size, query dtype; for PK0002 also K) through the kernel
the plugin would launch and compares it with the float64 reference
(:mod:`.reference`, :func:`.reference.spec_verify`): three sequences (1 token,
one page and a bit, 4 pages and a bit: one tile, a partial page, several KV
splits), seeded data, a random block table. Tolerance: relative L2 error
:data:`TOLERANCE` (the kernels measure about 1.5e-3 with bf16 outputs, from
the output rounding; a wrong kernel is off by order 1).

Called by ``vllm_entry.decode`` (PK0001) at the first eager call of each shape
and by ``sndr.runtime_patches.mtp`` (PK0002) when the metadata builder first
classifies a batch; both run before vLLM captures CUDA graphs (vLLM warms
every graph size up eagerly first). A first call inside a capture is
``canary_skipped`` for that call (vLLM's kernel is captured) and the canary
runs at the next eager call.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable
from pathlib import Path

import torch

from ... import env as sndr_env
from .. import _cudart
from .. import canary as _canary
from . import reference as ref

PK0001 = "PK0001"
PK0002 = "PK0002"
TOLERANCE = 2e-2
_HERE = Path(__file__).resolve().parent
_OK: dict[tuple, bool] = {}


def kernel_hash() -> str:
    """sha256 of this package's kernel sources and launch code (every ``.cu`` and ``.py`` here) and of the
    shared NVRTC/driver runtime ``sndr/kernels/_cudart.py`` that compiles and launches them."""
    shared = _canary.source_hash([_HERE.parent / "_cudart.py"])
    return hashlib.sha256((_canary.package_hash(_HERE, (".cu", ".py")) + shared).encode()).hexdigest()


# ----------------------------------------------------------------------------- the fixed problems


def lengths(page: int) -> list[int]:
    return [1, page + 3, 4 * page + 5]


def decode_problem(hq: int, hk: int, d: int, page: int, qdtype: torch.dtype, seed: int = 20261201):
    """(query, kv_cache, block_table, seq_lens, scale) on the CPU: seeded, packed by the reference store."""
    g = torch.Generator().manual_seed(seed)
    lens = lengths(page)
    nblk = [math.ceil(n / page) for n in lens]
    total = sum(nblk)
    perm = torch.randperm(total, generator=g)
    width = max(nblk)
    bt = torch.zeros(len(lens), width, dtype=torch.int32)
    at = 0
    for b, n in enumerate(nblk):
        bt[b, :n] = perm[at: at + n].to(torch.int32)
        at += n
    lay_slot = ref.Layout(d).slot_size_aligned
    kv = torch.zeros(total, page, hk, lay_slot, dtype=torch.uint8)
    for b, n in enumerate(lens):
        key = torch.randn(n, hk, d, generator=g) * 1.5
        value = torch.randn(n, hk, d, generator=g)
        slots = ref.pack(key, value)
        pos = torch.arange(n)
        kv[bt[b, pos // page].long(), pos % page] = slots
    query = (torch.randn(len(lens), hq, d, generator=g)).to(qdtype)
    return query, kv, bt, torch.tensor(lens, dtype=torch.int32), d ** -0.5


def relative_error(out: torch.Tensor, want: torch.Tensor) -> float:
    out = out.detach().double().cpu().reshape(want.shape)
    den = float(want.norm())
    return float((out - want).norm()) / (den if den > 0 else 1.0)


def decode_check(kernel: Callable, hq: int, hk: int, d: int, page: int, qdtype: torch.dtype,
                 device: torch.device | str = "cpu") -> tuple[float, float]:
    """Run ``kernel(query, kv_cache, block_table, seq_lens, scale) -> [B, Hq, D]`` on the fixed problem
    (tensors on ``device``) and return (relative error against float64, :data:`TOLERANCE`)."""
    q, kv, bt, sl, scale = decode_problem(hq, hk, d, page, qdtype)
    want = ref.decode(q, kv, bt, sl, scale)
    out = kernel(q.to(device), kv.to(device), bt.to(device), sl.to(device), scale)
    return relative_error(out, want), TOLERANCE


def verify_check(kernel: Callable, hq: int, hk: int, d: int, page: int, qdtype: torch.dtype, num_spec: int,
                 device: torch.device | str = "cpu") -> tuple[float, float]:
    """``kernel(query [B(K+1), Hq, D], kv, bt, seq_lens, scale, num_spec)`` on the fixed problem vs float64: the
    batch in one call and each request alone (below 17 query rows per KV head the CUDA verify kernel depends on the
    batch size, verify_wg.SMALL_BATCH, so both kernels a model shape may run are checked); the larger error."""

    _, kv, bt, sl, scale = decode_problem(hq, hk, d, page, qdtype)
    sl = (sl + num_spec).clamp_max(int(sl.max()))  # each request's K + 1 new tokens are inside its cache
    g = torch.Generator().manual_seed(7)
    ql = num_spec + 1
    q = torch.randn(len(sl) * ql, hq, d, generator=g).to(qdtype)
    want = ref.spec_verify(q, kv, bt, sl, scale, num_spec)
    kv, bt, sl = kv.to(device), bt.to(device), sl.to(device)
    out = kernel(q.to(device), kv, bt, sl, scale, num_spec)
    alone = torch.cat([kernel(q[i * ql:(i + 1) * ql].to(device), kv, bt[i:i + 1], sl[i:i + 1], scale, num_spec)
                       for i in range(len(sl))])
    return max(relative_error(out, want), relative_error(alone, want)), TOLERANCE


# ----------------------------------------------------------------------------- the plugins' first-use checks


def _capturing() -> bool:
    try:
        return torch.cuda.is_current_stream_capturing()
    except (RuntimeError, AssertionError):
        return False


def decode_ok(query: torch.Tensor, kv_cache: torch.Tensor, how: str) -> bool:
    """PK0001: may sndr's ``how`` kernel ("cuda" or "triton") serve this call's shape on this device?

    One dict lookup once the verdict is known; the first eager call of a shape
    runs the canary. Only CUDA tensors are checked (the CPU interpreter of the
    tests is not a device to protect)."""
    if query.device.type != "cuda":
        return True
    idx = _cudart.device_index(query)
    hq, d, page, hk = query.shape[1], query.shape[2], kv_cache.shape[1], kv_cache.shape[2]
    key = (PK0001, idx, how, hq, hk, d, page, query.dtype)
    hit = _OK.get(key)
    if hit is not None:
        return hit
    config = f"{how} d={d} Hq={hq} Hk={hk} page={page} {str(query.dtype).replace('torch.', '')}"
    ident, device = _canary.identity(idx)
    if _capturing():
        _canary.skip_in_capture(PK0001, config, device)
        return False

    def kernel(q, kv, bt, sl, scale):
        from . import dispatch, kernels

        if how == "triton":
            return kernels.triton_decode_attention(q, kv, bt, sl, scale, max_splits=32)
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        done = dispatch._try_cuda(q, kv, bt, sl, scale, out, None, None, 32)
        if done is None:
            from . import cuda_decode

            raise RuntimeError(cuda_decode._BROKEN.get(idx) or "the CUDA decode did not take the canary's call")
        return done

    with torch.cuda.device(idx):
        result = _canary.check(PK0001, config, device=device, identity=ident, kernel_hash=kernel_hash(),
                               run=lambda: decode_check(kernel, hq, hk, d, page, query.dtype, query.device))
    _OK[key] = result.ok
    return result.ok


def verify_ok(idx: int, dtype: torch.dtype, hq: int, hk: int, d: int, page: int, num_spec: int) -> bool:
    """PK0002: may marked verify batches of this model shape run ``mtp_verify.verify_attention`` here?"""
    from . import mtp_verify

    backend = sndr_env.tq_backend()
    key = (PK0002, idx, hq, hk, d, page, dtype, num_spec, backend)
    hit = _OK.get(key)
    if hit is not None:
        return hit
    config = f"{backend} K={num_spec} d={d} Hq={hq} Hk={hk} page={page} {str(dtype).replace('torch.', '')}"
    ident, device = _canary.identity(idx)

    def kernel(q, kv, bt, sl, scale, k):

        return mtp_verify.verify_attention(q, kv, bt, sl, scale, k)

    dev = torch.device("cuda", idx)
    with torch.cuda.device(idx):
        result = _canary.check(PK0002, config, device=device, identity=ident, kernel_hash=kernel_hash(),
                               run=lambda: verify_check(kernel, hq, hk, d, page, dtype, num_spec, dev))
    _OK[key] = result.ok
    return result.ok


def reset() -> None:
    _OK.clear()
