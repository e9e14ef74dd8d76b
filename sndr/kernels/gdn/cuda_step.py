"""PK0003's fused GDN step as a CUDA kernel (``step.cu``, compiled with NVRTC by :mod:`sndr.kernels._cudart`).

The same step as the Triton kernel (``kernels._gdn_step_kernel``) for the two calls of
vLLM's default path: the fused MTP op's call (``vllm_entry.try_post_conv_mtp``) and the
packed decode + gated RMSNorm (``vllm_entry.try_packed_decode_norm``). Where the routing
table says so (``routing.CUDA``: the cells where it measured faster than the Triton step
on the H200), those entries launch this kernel instead; everywhere else, and wherever
:func:`why_not` finds something against it (no CUDA device, the Triton interpreter, no
NVRTC, a shape or dtype outside the kernel's set), the Triton step runs, the reason
logged once.

Launch shape (``CudaConfig``, per measured cell in ``routing.CUDA_SHAPES``): the V rows of
each (request, value head) over ``V / block_v`` CTAs (a thread-block cluster when more than
one) of ``nthreads`` threads, each thread holding ``rows`` state rows x ``K / lanes``
columns in registers, passing over the CTA's rows ``(nthreads / lanes) * rows`` at a time;
the head's RMSNorm through the cluster's shared memory (``step.cu`` says how). ``bulk``: the head's
state tile copied into shared memory (one ``cp.async.bulk``) while the CTA stages its inputs, the
passes reading their rows from there (``step.cu``'s TILE_SMEM). ``chain``: the short dependent-load chain
(``step.cu``'s SHORT_CHAIN: the index columns loaded with ``num_accepted``, every staged input before the
state rows; the register tile in one pass). Up to
:data:`MAX_TM` index columns (tokens per request). A :class:`CudaStep` packs every argument
of one call layout once (``_cudart.Launch``); a call then writes only the data pointers.
"""

from __future__ import annotations

import logging
import re
import struct
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from .. import _cudart

LOG = logging.getLogger("sndr.kernels")
SOURCE = Path(__file__).with_name("step.cu")
KERNEL = "gdn_fused_step"
_KIND = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}
_LOGGED: set[str] = set()
#: launches of the CUDA step in this process (tests: which kernel a routed call ran)
STATS = {"launches": 0}
#: the most tokens per request (index columns) the CUDA step takes: its CTAs stage every token's inputs
MAX_TM = 16
#: the largest portable thread-block cluster (CTAs per head)
MAX_CLUSTER = 8
#: launch shapes with the head's state tile in shared memory (suffix ``b``; one cp.async.bulk per tile), timed by
#: bench_gdn.py beside the register-tile shapes (docs/bench-gdn-h200.md)
SMEM_TILE_SHAPES = ("128x8x4t256m2b", "128x8x2t256m4b", "128x16x4t512m2b", "128x16x2t512m2b")
#: shared-tile shapes with the short chain in their prologue (suffix ``cb``: every lane resolves the item, then the
#: tile's copy starts one memory round trip earlier), timed by bench_gdn.py in the spec-verify cells (T >= 2) only:
#: a plain decode's chain is one load already, and there the R = 2 build keeps a 16-24 byte stack (NVRTC 13.5)
CHAIN_TILE_SHAPES = ("128x8x2t256m4cb", "128x16x4t512m2cb", "128x16x2t512m2cb")
#: launch shapes with the short load chain (suffix ``c``), timed by bench_gdn.py at batch 1 and 8 (docs/bench-gdn-h200.md)
#: (128 registers, one pass: 1, 2 or 4 CTAs a head; the 64-register R = 2 cluster shapes keep 16-48 byte stacks with
#: NVRTC 13.0, with or without it)
CHAIN_SHAPES = ("128x8x4t256m2c", "64x8x4t128m4c", "32x8x4t64m8c", "16x8x1t128m8c")
#: cluster shapes whose norm's partial sums go by st.async to the receiver's mbarrier (suffix ``a``: no release
#: barrier draining the snapshot stores before the norm), timed by bench_gdn.py beside their twins
ASYNC_NORM_SHAPES = ("64x8x4t128m4ca", "32x8x4t64m8ca", "16x8x1t128m8ca", "64x8x1t128m8a")
#: short-chain shapes that send a uniform batch's token rows to L2 while cu_seqlens is in flight (suffix ``g``),
#: timed by bench_gdn.py beside their twins
GUESS_SHAPES = ("128x8x2t256m4cbg", "64x8x4t128m4cag", "128x8x4t256m2cg")
#: the routed shapes' twins whose row sums go by a reduce-scatter over the row's lanes (suffix ``x``: bitwise the
#: shape without it, fewer shuffles), timed by bench_gdn.py beside them
SCATTER_SHAPES = ("64x8x4t128m4cagx", "128x8x2t256m4cbgx", "128x8x2t256m4bx", "128x16x4t512m2cbx",
                  "128x16x4t512m2bx", "16x8x1t128m8cax", "128x8x4t256m2cgx", "32x8x4t64m8cax")
#: the twin of a routed shape at five CTAs per multiprocessor (96 registers, not 128): faster with a bf16 pool at
#: T = 2 in this stop's probe (batch 32-256, 4-5%), timed by bench_gdn.py beside it. At the register cap NVRTC 13.0
#: keeps a stack of 8-56 bytes (the layer's bf16 call: 0-8 at TM 1-2, 16-48 at TM 4-8; fp32 pool 16-24), spills the
#: benchmark's timings include (test_cuda_step allows up to 64 bytes for these shapes only)
SPILL_AT_CAP_SHAPES = ("64x8x4t128m5cagx",)
#: every launch shape offered beside the plain register-tile ones (the lists above, in order): each is bit for bit
#: its register-tile twin (the shape without its suffixes; GPU test_shared_tile_shapes_equal_their_register_twin_bitwise),
#: compiled for sm_90 by test_cuda_step and digested by benchmarks/gdn_sass_digest.py
TWIN_SHAPES = tuple(dict.fromkeys(SMEM_TILE_SHAPES + CHAIN_SHAPES + CHAIN_TILE_SHAPES + ASYNC_NORM_SHAPES + GUESS_SHAPES
                                  + SCATTER_SHAPES + SPILL_AT_CAP_SHAPES))
#: the largest state tile (bytes) a shared-tile shape takes (dynamic shared memory; 227 KiB a CTA at most on sm_90,
#: the staging's static arrays beside it)
MAX_SMEM_TILE = 128 * 1024
#: ``gdn_fused_step``'s parameters in order, with their kinds (``_cudart.Launch``: p pointer, f float32,
#: i int32, q int64): the tensors, then the scalars and strides
PARAMS = (("x", "p"), ("a", "p"), ("b", "p"), ("A_log", "p"), ("dt_bias", "p"), ("out", "p"), ("state", "p"),
          ("indices", "p"), ("num_accepted", "p"), ("cu_seqlens", "p"), ("z", "p"), ("norm_w", "p"),
          ("scale", "f"), ("norm_eps", "f"), ("cols", "i"), ("s_x_tok", "q"), ("s_a_tok", "q"), ("s_b_tok", "q"),
          ("s_o_tok", "q"), ("s_z_tok", "q"), ("s_z_head", "q"), ("s_state_slot", "q"), ("s_idx_seq", "q"),
          ("s_idx_tok", "q"), ("n_items", "i"))
SIG = "".join(kind for _, kind in PARAMS)
N_PTR = SIG.count("p")


@dataclass(frozen=True)
class CudaConfig:
    """``block_v``: state rows per CTA (V / block_v CTAs per head, a cluster); ``lanes``: threads per
    row (P); ``rows``: rows per thread (R); ``nthreads``: threads per CTA, which pass over the CTA's rows
    ``(nthreads / lanes) * rows`` at a time, the next pass's rows loaded while one computes;
    ``min_blocks``: CTAs per SM asked of ptxas's register allocator; ``stream``: streaming (``.cs``)
    snapshot stores; ``bulk``: the head's state tile copied into shared memory while the CTA stages its
    inputs (one CTA per head: ``block_v`` = V); ``chain``: the short load chain (register tile, one pass);
    ``norm_async`` (clusters): the norm's partial sums sent by ``st.async`` completing the receiver's mbarrier,
    with no release barrier (which waits for the snapshot stores to drain); ``guess`` (short chain, MTP call):
    the token rows of a uniform batch sent to L2 while ``cu_seqlens`` is in flight; ``scatter``: each token's row
    sums over the row's lanes by one reduce-scatter (about R + 2R shuffles, not 2R log2(lanes))."""

    block_v: int = 128
    lanes: int = 8
    rows: int = 1
    nthreads: int = 128
    min_blocks: int = 8
    stream: bool = False
    bulk: bool = False
    chain: bool = False
    norm_async: bool = False
    guess: bool = False
    scatter: bool = False

    def threads(self) -> int:
        return self.nthreads

    def label(self) -> str:
        """``BVxPxRtNTmN[s][c][b][a][g][x]`` (rows per CTA, lanes per row, rows per thread, threads, CTAs per SM,
        streaming, short load chain, state tile in shared memory, the norm's sums by st.async, guessed rows to L2,
        the row sums by a reduce-scatter)."""
        return (f"{self.block_v}x{self.lanes}x{self.rows}t{self.nthreads}m{self.min_blocks}"
                f"{'s' if self.stream else ''}{'c' if self.chain else ''}{'b' if self.bulk else ''}"
                f"{'a' if self.norm_async else ''}{'g' if self.guess else ''}{'x' if self.scatter else ''}")

    @classmethod
    def parse(cls, label: str) -> CudaConfig:
        m = re.fullmatch(r"(\d+)x(\d+)x(\d+)(?:t(\d+))?(?:m(\d+))?(s?)(c?)(b?)(a?)(g?)(x?)", label)
        if not m:
            raise ValueError(f"CUDA launch shape {label!r}: BVxPxR[tN][mN][s][c][b][a][g][x]")
        return cls(int(m.group(1)), int(m.group(2)), int(m.group(3)), int(m.group(4) or 128), int(m.group(5) or 6),
                   m.group(6) == "s", m.group(8) == "b", m.group(7) == "c",
                   m.group(9) == "a", m.group(10) == "g", m.group(11) == "x")

    def spec_only(self) -> bool:
        """Timed (and routed) in spec-verify cells only: the shared tile with the short chain (``cb``; see
        :data:`CHAIN_TILE_SHAPES`)."""
        return self.chain and self.bulk

    def register_twin(self) -> CudaConfig:
        """The plain register-tile shape this one must equal bit for bit (:data:`TWIN_SHAPES`): the same rows, lanes,
        threads and CTAs per SM, without the shared tile, the short chain, the st.async norm, the guessed rows and
        the reduce-scatter."""
        return replace(self, bulk=False, chain=False, norm_async=False, guess=False, scatter=False)

    def rows_per_pass(self) -> int:
        return (self.nthreads // self.lanes) * self.rows if self.lanes > 0 else 0


def default_config(v: int, k: int) -> CudaConfig:
    """One CTA per (request, value head), 128 threads passing over its V rows 16 at a time (8 lanes a row)."""
    return CudaConfig(block_v=v, lanes=max(1, min(8, k // 16)), min_blocks=6)


def pick_config(n_req: int, hv: int, v: int, k: int, state_dtype: torch.dtype, tokens: int) -> CudaConfig:
    """The launch shape for ``n_req`` requests of ``tokens`` tokens: the one measured fastest in the nearest
    cell of the benchmark (``routing.CUDA_SHAPES``, at the measured head shape K = V = 128), else
    :func:`default_config`."""
    del hv
    from . import routing

    if (k, v) == (128, 128):
        label = routing.cuda_shape(str(state_dtype).replace("torch.", ""), n_req, tokens)
        if label is not None:
            return CudaConfig.parse(label)
    return default_config(v, k)


def source() -> str:
    """step.cu with the state-row header it includes (rows.cuh, shared with replay.cu)."""
    return _cudart.read_source(SOURCE)


def defines(H: int, HV: int, K: int, V: int, cfg: CudaConfig, *, spec: bool, tm: int, kinds: dict[str, int],
            sigmoid_gate: bool = False, idx64: bool = False, acc64: bool = False, cu64: bool = False) -> dict:
    """The NVRTC defines of one kernel build (``kinds``: X_KIND, AB_KIND, ALOG_KIND, DT_KIND, Z_KIND,
    W_KIND, O_KIND, S_KIND)."""
    d = {"H": H, "HV": HV, "K": K, "V": V, "BV": cfg.block_v, "P": cfg.lanes, "R": cfg.rows, "NT": cfg.nthreads,
         "TM": tm,
         "MINB": max(1, min(cfg.min_blocks, 2048 // max(cfg.threads(), 32))), "SPEC": int(spec), "STREAM": int(cfg.stream), "SIGMOID_GATE": int(sigmoid_gate),
         "IDX64": int(idx64), "ACC64": int(acc64), "CU64": int(cu64)}
    if cfg.bulk:  # (absent from the register-tile shapes' defines: their cubin keys stay as they were)
        d["TILE_SMEM"] = 1
    if cfg.chain:  # (likewise)
        d["SHORT_CHAIN"] = 1
    if cfg.norm_async:  # (likewise)
        d["NORM_ASYNC"] = 1
    if cfg.guess and spec:  # (likewise; the packed decode's rows are known at launch: no guess)
        d["GUESS_ROWS"] = 1
    if cfg.scatter:  # (likewise)
        d["SCATTER_SUMS"] = 1
    d.update(kinds)
    return d


def config_why(K: int, V: int, state_dtype: torch.dtype, cfg: CudaConfig) -> str | None:
    """Why ``step.cu`` cannot be built for this head shape and launch shape, or None."""
    epc = 16 // (4 if state_dtype == torch.float32 else 2)
    nt = cfg.threads()
    if K % 32 or K > 256 or cfg.lanes & (cfg.lanes - 1) or not 0 < cfg.lanes <= 32 or K % (epc * cfg.lanes):
        return f"K = {K} with {cfg.lanes} lanes per row"
    rp = cfg.rows_per_pass()
    if (V % cfg.block_v or V // cfg.block_v > MAX_CLUSTER or nt % 32 or not 0 < nt <= 1024 or nt % cfg.lanes
            or rp <= 0 or cfg.block_v % rp):
        return f"V = {V} with {cfg.block_v} rows per CTA, {nt} threads and {cfg.rows} rows per thread"
    if cfg.bulk and V * K * (4 if state_dtype == torch.float32 else 2) > MAX_SMEM_TILE:
        return f"a {V} x {K} state tile in shared memory (takes <= {MAX_SMEM_TILE // 1024} KiB)"
    if cfg.bulk and cfg.block_v != V:
        return f"a state tile in shared memory with {V // cfg.block_v} CTAs per head (one CTA per head only)"
    if cfg.guess and not cfg.chain:
        return "guessed token rows without the short load chain"
    if cfg.norm_async and cfg.block_v == V:
        return "the norm's sums by st.async with one CTA per head (a cluster's only)"
    if cfg.chain and not cfg.bulk and cfg.block_v != rp:
        return f"the short load chain with {cfg.block_v // rp} passes (the register tile in one pass only)"
    e = cfg.rows * K // cfg.lanes
    if e > (32 if cfg.block_v > rp else 64):  # more than one pass: the next pass's values are in registers too
        return f"{e} state values per thread" + (" (two passes' worth in registers)" if cfg.block_v > rp else "")
    return None


def why_not(state: torch.Tensor, tensors: dict[str, torch.Tensor], cfg: CudaConfig) -> str | None:
    """Why the CUDA step does not take this call (the Triton step then does), or None."""
    from . import kernels

    why = _cudart.device_refusal(state, (9, 0), "thread-block clusters need sm_90+")
    if why:
        return why
    if kernels.interpreting():
        return "the Triton interpreter is on"
    if state.dtype not in (torch.float32, torch.bfloat16):
        return f"state dtype {state.dtype}"
    for name, t in tensors.items():
        if name in ("idx", "acc", "cu"):
            if t.dtype not in (torch.int32, torch.int64):
                return f"{name} dtype {t.dtype}"
        elif t.dtype not in _KIND:
            return f"{name} dtype {t.dtype}"
    if tensors["idx"].dim() == 2 and tensors["idx"].shape[1] > MAX_TM:
        return f"{tensors['idx'].shape[1]} index columns (takes <= {MAX_TM})"
    if tensors["a"].dtype != tensors["b"].dtype:
        return "a and b of different dtypes"
    _, _, v, k = state.shape
    why = config_why(k, v, state.dtype, cfg)
    if why:
        return why
    if state.stride(0) * state.element_size() % 16:
        return "state slots not 16-byte aligned"
    try:
        _cudart.nvrtc_version()
    except _cudart.CudaUnavailable as exc:
        return str(exc)
    return None


def log_fallback(why: str) -> None:
    if why not in _LOGGED:
        _LOGGED.add(why)
        LOG.warning("sndr PK0003: the Triton step instead of the CUDA one: %s (logged once)", why)


_KERNELS: dict[tuple, _cudart.Kernel] = {}


def kernel(defs: dict, device_index: int, dynamic_smem: int = 0) -> _cudart.Kernel:
    key = (tuple(sorted(defs.items())), device_index, dynamic_smem)
    k = _KERNELS.get(key)
    if k is None:
        k = _KERNELS[key] = _cudart.load_kernel(source(), KERNEL, defs, device_index, dynamic_smem=dynamic_smem,
                                                label="gdn_step")
    return k


def tile_bytes(state: torch.Tensor) -> int:
    """One (slot, value head) state tile, V x K in the pool's dtype: a shared-tile shape's dynamic shared memory."""
    return state.shape[2] * state.shape[3] * state.element_size()


def scalar_values(mixed_qkv, a, b, out, state, idx, z, *, scale: float, norm_eps: float, cols: int,
                  n_items: int = 0) -> list:
    """Every value of :data:`PARAMS` for one call layout, the pointers as 0 (written per call); ``n_items``:
    the (request, value head) items (the shared-tile shapes' bound on blockIdx.x)."""
    named = {"n_items": int(n_items), "scale": float(scale), "norm_eps": float(norm_eps), "cols": int(cols),
             "s_x_tok": mixed_qkv.stride(0), "s_a_tok": a.stride(0), "s_b_tok": b.stride(0), "s_o_tok": out.stride(0), "s_z_tok": z.stride(0),
             "s_z_head": z.stride(1), "s_state_slot": state.stride(0), "s_idx_seq": idx.stride(0),
             "s_idx_tok": idx.stride(1) if idx.dim() == 2 else 1}
    return [0 if kind == "p" else named[name] for name, kind in PARAMS]


class CudaStep:
    """One call layout of the CUDA step: the kernel built and every argument but the pointers packed.

    ``spec``: the MTP op's call (``cu_seqlens``, ``num_accepted_tokens``, [N, cols] indices);
    else the packed decode (one token per request, [N] indices)."""

    def __init__(self, mixed_qkv, a, b, A_log, dt_bias, out, state, idx, z, norm_w, *, n_req: int, spec: bool,
                 scale: float, norm_eps: float, sigmoid_gate: bool, acc=None, cu=None, cfg: CudaConfig):
        HV, V, K = state.shape[1], state.shape[2], state.shape[3]
        H = (mixed_qkv.shape[1] - HV * V) // (2 * K)
        cols = idx.shape[1] if spec else 1
        tm = min(MAX_TM, 1 << max(0, (cols - 1).bit_length()))
        kinds = {"X_KIND": _KIND[mixed_qkv.dtype], "AB_KIND": _KIND[a.dtype], "ALOG_KIND": _KIND[A_log.dtype],
                 "DT_KIND": _KIND[dt_bias.dtype], "Z_KIND": _KIND[z.dtype], "W_KIND": _KIND[norm_w.dtype],
                 "O_KIND": _KIND[out.dtype], "S_KIND": _KIND[state.dtype]}
        self.defines = defines(H, HV, K, V, cfg, spec=spec, tm=tm, kinds=kinds, sigmoid_gate=sigmoid_gate,
                               idx64=idx.dtype == torch.int64,
                               acc64=acc is not None and acc.dtype == torch.int64,
                               cu64=cu is not None and cu.dtype == torch.int64)
        self.spec, self.cfg = spec, cfg
        dev = _cudart.device_index(state)
        self.device = dev
        kern = kernel(self.defines, dev, tile_bytes(state) if cfg.bulk else 0)
        items = n_req * HV
        self.grid = items * (V // cfg.block_v)
        self.launch = _cudart.Launch(kern, max(self.grid, 1), cfg.threads(), SIG,
                                     scalar_values(mixed_qkv, a, b, out, state, idx, z, scale=scale,
                                                   norm_eps=norm_eps, cols=cols, n_items=items))
        self._ptr_off = [self.launch.offset(i) for i in range(N_PTR)]

    def __call__(self, mixed_qkv, a, b, A_log, dt_bias, out, state, idx, z, norm_w, acc=None, cu=None) -> bool:
        """Launch on torch's current stream; False (nothing launched) for a pool not 16-byte aligned (the
        caller then runs the Triton step)."""
        if self.grid == 0:
            return True
        if state.data_ptr() % 16:
            log_fallback("state pool not 16-byte aligned")
            return False
        L = self.launch
        ptrs = (mixed_qkv, a, b, A_log, dt_bias, out, state, idx, acc if acc is not None else idx,
                cu if cu is not None else idx, z, norm_w)
        for off, t in zip(self._ptr_off, ptrs):
            struct.pack_into("<Q", L.args, off, t.data_ptr())
        L.launch(torch.cuda.current_stream(self.device).cuda_stream)
        STATS["launches"] += 1
        return True
