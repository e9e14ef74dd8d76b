"""CUDA backend of the k8v4 split-KV decode (``decode_k8v4.cu``, built by NVRTC).

Same contract and workspace as the Triton split kernel in ``kernels``: a split
kernel writes each split's normalised partial output and log2-sum-exp, a merge
combines them, so the two backends are interchangeable call for call.

* ``page`` kernel (sm_90, the default): a block per (sequence, split), a warp
  per KV head, 16-token tiles of all heads copied by TMA; head dims 64/128/256.
* ``warp`` kernel (sm_89+, caches TMA cannot copy): a warp per (sequence, KV
  head, split), 4-byte ``cp.async`` copies; head dims 64/128.
* merge: the Triton ``kernels._merge_kernel`` when a CUDA graph is being
  captured (less GPU time), the CUDA ``tq_k8v4_merge`` for eager calls (less
  CPU time); see :func:`launch_merge`.

All three come from one NVRTC build per model shape (head dim, page size, row
stride, group size, query dtype, kernel kind), cached on disk and loaded once
per device (``_cudart``); :func:`kernel_plan` memoises the choice per call shape.

``SNDR_TQ_BACKEND`` = ``auto`` (default: CUDA where :func:`unsupported` finds
nothing against it, else Triton), ``cuda`` (raise instead of falling back) or
``triton``.
"""

from __future__ import annotations

import ctypes as C
import functools
import logging
import math
import struct
from dataclasses import dataclass
from pathlib import Path

import torch
import triton

from .. import _cudart
from ._layout import LOG2E, workspace_numel

SOURCE_PATH = Path(__file__).with_name("decode_k8v4.cu")
KERNELS = {"page": "tq_k8v4_decode_page", "warp": "tq_k8v4_decode_split"}
MERGE = "tq_k8v4_merge"
MERGE_ROWS = "tq_k8v4_merge_rows"  # the same merge, a warp per output row (merge modes "rows", "rows_pdl"; PK0002's)
MERGE_ROWS_PER_BLOCK = 8  # decode_k8v4.cu's MRW
MERGED = "tq_k8v4_decode_page_merged"  # page kernel with the merge folded into each sequence's last block
CLUSTERED = "tq_k8v4_decode_page_cluster"  # page kernel merging through clusters of splits (CudaConfig.cluster)
GRID = "tq_k8v4_decode_page_grid"  # page kernel merging in the same cooperative grid (CudaConfig.grid_merge)
MAX_SPLITS = 128  # the merge kernel's shared weights array
MERGE_WARPS = 8  # warps of a merge block (MW)
TILE = 16
WARP_STAGE_BYTES = {64: 4 * (16 * 16 + 16 * 20 + 16), 128: 4 * (16 * 36 + 16 * 20 + 16)}
LOG = logging.getLogger("sndr.kernels")


@dataclass(frozen=True)
class CudaConfig:
    kind: str = "page"  # "page": a block per (sequence, split), TMA row copies; "warp": a warp per head+split
    stages: int = 3  # copy ring depth (tiles)
    warps: int = 4  # "warp" kind: warps (independent work items) per block
    min_blocks: int = 4  # blocks per SM asked of the register allocator ("page": 2)
    tau: float = 8.0  # lazy-rescale slack, log2 units
    min_split_tokens: int = 32  # a sequence gets at most one split per this many tokens
    waves: int = 1  # the split count aims at this many full waves of warps
    max_splits: int = 128  # may exceed the caller's cap (vLLM's 32): scratch is then allocated here
    cluster: int = 0  # "page" kind: > 0 merges inside the split kernel, clusters of this many splits (CL)
    evict_first: bool = False  # "page" kind: read the cache with an L2 evict-first policy (EVF)
    grid_merge: bool = False  # "page" kind, 8 KV heads: merge in the split kernel's own cooperative grid (GM)


def row_pitch(sp: int) -> tuple[int, int]:
    """(ROWP, ROWCOPY) of the page kernel's stage rows for a cache row stride of sp bytes.

    Rows are copied one by one (TMA needs 16-byte multiples) into rows padded
    so that their word pitch is 4 or 12 mod 16: the fragment reads are then free
    of bank conflicts. Otherwise the tile is one copy with the cache's own pitch.
    """
    if sp % 16:
        return sp, 0
    p = sp
    while p % 16 or (p // 4) % 16 not in (4, 12):
        p += 4
    return p, 1


def page_kind_ok(kv_cache: torch.Tensor) -> bool:
    """The page kernel copies whole token rows (all KV heads) with TMA."""
    hk, slot = kv_cache.shape[2], kv_cache.shape[3]
    st = kv_cache.stride()
    return (hk <= 16 and kv_cache.data_ptr() % 16 == 0 and st[0] % 16 == 0
            and st[2] >= slot and st[1] >= st[2] * (hk - 1) + slot
            and _capability(device_index(kv_cache)) >= (9, 0))


def smem_bytes(cfg: CudaConfig, head_dim: int, sp: int) -> int:
    if cfg.kind == "page":
        return cfg.stages * 16 * row_pitch(sp)[0] + 16 * cfg.stages
    return cfg.stages * cfg.warps * WARP_STAGE_BYTES[head_dim]


# Measured best on an H200 (docs/bench-tq-decode-h200.md): one wave of blocks,
# up to 128 splits of >= 32 tokens (small batches fill the GPU), 3 stages.
DEFAULT = CudaConfig(kind="page", stages=3, min_blocks=2)
_SOURCE: list[str] = []
_BROKEN: dict[int, str] = {}  # device index -> why the CUDA backend is off there


def _source() -> str:
    if not _SOURCE:
        _SOURCE.append(SOURCE_PATH.read_text())
    return _SOURCE[0]


# the device facts have one home (_cudart); these names are this module's seams (tests set them)
device_index = _cudart.device_index
_capability = _cudart.capability
_sm_count = _cudart.sm_count


def config_problem(head_dim: int, page: int, hq: int, hk: int, qdtype: torch.dtype,
                   capability: tuple[int, int] | None = None, page_kernel_ok: bool = True) -> str | None:
    """Why the CUDA kernels do not cover a model config (None: they do). Pure.

    Covered: head dim 64 or 128 (256: the page kernel, so sm_90 and a cache TMA
    can copy, ``page_kernel_ok``), a page of a multiple of 16 tokens, 1..16 query
    heads per KV head, fp16/bf16 queries, sm_89+ (``capability`` None: not checked).
    """
    if capability is not None and capability < (8, 9):
        return "needs sm_89+ (fp8 e4m3 conversions)"
    if head_dim not in (64, 128, 256):
        return f"head dim {head_dim} (64, 128 or 256 only)"
    if hk <= 0 or hq % hk or not 1 <= hq // hk <= 16:
        return f"group size Hq/Hk = {hq}/{hk}"
    if page % TILE:
        return f"page size {page} is not a multiple of {TILE}"
    if qdtype not in (torch.float16, torch.bfloat16):
        return f"query dtype {qdtype}"
    if head_dim not in WARP_STAGE_BYTES and (not page_kernel_ok or (capability is not None and capability < (9, 0))):
        return f"head dim {head_dim} needs the page kernel (sm_90, 16-byte aligned cache)"
    return None


def shape_problem(query: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor,
                  seq_lens: torch.Tensor) -> str | None:
    """What in the call's shapes, dtypes or strides the CUDA kernels cannot take (None: nothing)."""
    bsz, hq, d = query.shape
    why = config_problem(d, kv_cache.shape[1], hq, kv_cache.shape[2], query.dtype)
    if why is not None:
        return why
    if query.stride(2) != 1 or query.stride(0) % 2 or query.stride(1) % 2 or query.data_ptr() % 4:
        return "query rows not 4-byte aligned"
    if kv_cache.dtype != torch.uint8 or kv_cache.stride(3) != 1 or kv_cache.data_ptr() % 4 \
            or any(kv_cache.stride(i) % 4 for i in range(3)):
        return "cache rows not 4-byte aligned uint8"
    if block_table.dtype != torch.int32 or block_table.stride(1) != 1:
        return "block table not int32 rows"
    if seq_lens.dtype != torch.int32 or not seq_lens.is_contiguous():
        return "seq_lens not contiguous int32"
    return None


def unsupported(query: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor,
                seq_lens: torch.Tensor) -> str | None:
    """Why the CUDA kernels cannot take this call (None: they can)."""
    why = _cudart.device_refusal(query, (8, 9), "needs sm_89+ (fp8 e4m3 conversions)", _BROKEN)
    if why:
        return why
    why = shape_problem(query, kv_cache, block_table, seq_lens)
    if why is None and query.shape[2] not in WARP_STAGE_BYTES and not page_kind_ok(kv_cache):
        why = f"head dim {query.shape[2]} needs the page kernel (sm_90, 16-byte aligned cache)"
    return why


def defines(query: torch.Tensor, kv_cache: torch.Tensor, cfg: CudaConfig) -> dict[str, int | str]:
    hq, d = query.shape[1], query.shape[2]
    hk = kv_cache.shape[2]
    sp = kv_cache.stride(1)
    out: dict[str, int | str] = {
        "D": d, "SP": sp, "PAGE": kv_cache.shape[1], "G": hq // hk,
        "QBF16": int(query.dtype == torch.bfloat16), "STAGES": cfg.stages, "NW": cfg.warps,
        "MINB": _min_blocks(cfg, hk, hq // hk, d), "TAU": f"{float(cfg.tau)!r}f", "PAGE_CTA": int(cfg.kind == "page"),
    }
    if cfg.kind == "page":
        rowp, rowcopy = row_pitch(sp)
        out.update(HK=hk, ROWP=rowp, ROWCOPY=rowcopy)
        if cfg.cluster:
            out["CL"] = cfg.cluster
        if cfg.evict_first:
            out["EVF"] = 1
        if cfg.grid_merge and hk == MERGE_WARPS:
            out["GM"] = 1
    return out


def _min_blocks(cfg: CudaConfig, hk: int, g: int, d: int = 128) -> int:
    """Blocks per SM asked of the register allocator (__launch_bounds__).

    The page kernel's blocks are Hk warps: min_blocks counts blocks of 8 warps.
    G > 8 and head dim 256 hold twice the accumulators: half as many each, or
    the kernel spills.
    """
    n = max(1, (cfg.min_blocks * 8) // hk) if cfg.kind == "page" else cfg.min_blocks
    if d > 128:  # twice the accumulators and fragments per warp
        n = max(1, n // 2)
    return n if g <= 8 else max(1, n // 2)


def resolve(cfg: CudaConfig, kv_cache: torch.Tensor) -> CudaConfig:
    """The page kernel where the cache allows it, else the warp kernel."""
    if cfg.kind == "page" and not page_kind_ok(kv_cache):
        return CudaConfig(**{**cfg.__dict__, "kind": "warp", "min_blocks": 4, "cluster": 0, "grid_merge": False})
    return cfg


_PLANS: dict[tuple, tuple[CudaConfig, _cudart.Kernel, int]] = {}


def _plan_key(query: torch.Tensor, kv_cache: torch.Tensor, cfg: CudaConfig) -> tuple:
    return (device_index(query), query.dtype, query.shape[1], query.shape[2], tuple(kv_cache.shape[1:]),
            kv_cache.stride(), kv_cache.data_ptr() % 16 == 0, cfg)


def planned(query: torch.Tensor, kv_cache: torch.Tensor, cfg: CudaConfig | None = None) -> bool:
    """Whether this call's kernels are already built and loaded (no compile, no driver calls)."""
    return _plan_key(query, kv_cache, cfg or DEFAULT) in _PLANS


def kernel_plan(query: torch.Tensor, kv_cache: torch.Tensor, cfg: CudaConfig) -> tuple[CudaConfig, _cudart.Kernel, int]:
    """(resolved config, compiled kernel, resident warps per SM) for this call's shape.

    Memoised on everything the build depends on, so a steady-state call costs a
    dict lookup (no hashing of the source, no driver queries).
    """
    key = _plan_key(query, kv_cache, cfg)
    hit = _PLANS.get(key)
    if hit is None:
        rcfg = resolve(cfg, kv_cache)
        k, wps = kernel_for(query, kv_cache, rcfg)
        hit = _PLANS[key] = (rcfg, k, wps)
    return hit


def kernel_for(query: torch.Tensor, kv_cache: torch.Tensor, cfg: CudaConfig) -> tuple[_cudart.Kernel, int]:
    """(compiled kernel, resident warps per SM) for this call's shape."""
    idx = device_index(query)
    defs = defines(query, kv_cache, cfg)
    k = _cudart.load_kernel(_source(), KERNELS[cfg.kind], defs, idx,
                            smem_bytes(cfg, query.shape[2], kv_cache.stride(1)), label="decode_k8v4")
    per_block = kv_cache.shape[2] if cfg.kind == "page" else cfg.warps
    return k, max(1, k.blocks_per_sm(32 * per_block)) * per_block


@functools.lru_cache(maxsize=4096)
def num_splits(batch_heads: int, warps_per_sm: int, sms: int, max_splits: int, waves: int = 2) -> int:
    """Splits per sequence from the launch shape only (CUDA-graph safe).

    About ``waves`` full waves of warps; where ``max_splits`` caps that, the
    count whose last wave is fullest (ties: more splits).
    """
    slots = warps_per_sm * sms
    want = (waves * slots) // max(1, batch_heads)
    if want <= max_splits:
        return max(1, want)
    return max(range(1, max_splits + 1),
               key=lambda s: (batch_heads * s / (-(-batch_heads * s // slots) * slots), s))


# How the splits are merged, for eager calls and inside a CUDA-graph capture:
#   "cuda"   the CUDA merge kernel after the split kernel (tq_k8v4_merge: a block per output row);
#   "rows"   the same with tq_k8v4_merge_rows (a warp per output row, PK0002's merge); "rows_pdl" that with PDL;
#   "pdl"    the same, launched with programmatic dependent launch (sm_90 and a
#            split grid of one wave; else "cuda"): its blocks are scheduled while
#            the split kernel drains and wait for it in-kernel;
#   "fold"   no merge kernel: the page kernel's last block per sequence merges
#            (page kernel only; else "pdl");
#   "triton" the Triton merge (graphs only: it costs ~30 us of CPU per launch).
# A plan whose config asks for clusters (CudaConfig.cluster) runs "cluster" in
# both: no merge kernel, the page kernel merges through DSMEM and per-slice
# arrival counters (tq_k8v4_decode_page_cluster); one that asks for
# grid_merge runs "grid" where the grid is one wave of 8-warp blocks: the page
# kernel launched cooperatively, each sequence's blocks merging it after a
# per-sequence arrival count (tq_k8v4_decode_page_grid).
# Measured on an H200 (docs/bench-tq-decode-h200.md, --merge-probe): PDL and the
# folded merge each slow some cell (fold: B=8 / 8K by 12-23 us), so neither ships.
MERGE_POLICY = {"eager": "cuda", "graph": "triton"}
_OUT_KIND = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}
_SPLIT_SIG = "ppppppfiiiiiqqqqq"
_MERGE_SIG = "pppppiiiqqqii"
_MERGE_ROWS_SIG = _MERGE_SIG + "i"  # + the row count
_MERGED_SIG = _SPLIT_SIG + "pppqqqii"
_PTRS6 = struct.Struct("<6Q")
_PTRS5 = struct.Struct("<5Q")
_PTRS3 = struct.Struct("<3Q")
_F32 = struct.Struct("<f")
_STREAM = struct.Struct("<Q")


class LaunchPlan:
    """Everything one call shape launches, built once: the split count, the
    workspace layout and packed launches (``_cudart.Launch``) for the split
    kernel, both merge launches, the folded kernel and, where the config asks
    for them, the cluster-merging (``CudaConfig.cluster``) or grid-merging
    (``CudaConfig.grid_merge``) kernel. A call patches the data pointers and the
    stream and launches (:meth:`launch`).

    The shape covers the query, cache, block-table strides, output / LSE
    strides and dtype, and the split cap; ``dispatch`` memoises plans per call
    metadata. Scratch the plan owns (when the caller's is too small) and the
    folded kernel's arrival counters are kept per stream, never freed (a
    captured graph may hold their addresses).
    """

    def __init__(self, query, kv_cache, block_table, out_dtype, out_strides, lse_stride0, max_splits: int,
                 config: CudaConfig | None = None):
        cfg, k, wps = kernel_plan(query, kv_cache, config or DEFAULT)
        bsz, hq, d = query.shape
        hk = kv_cache.shape[2]
        idx = device_index(query)
        self.cfg, self.kernel, self.device = cfg, k, idx
        self.bsz, self.hq, self.d = bsz, hq, d
        sms = _sm_count(idx)
        splits = num_splits(bsz * hk, wps, sms, min(MAX_SPLITS, max(max_splits, cfg.max_splits)), cfg.waves)
        self.cuda_merge = out_dtype in _OUT_KIND and out_strides is not None
        cl = cfg.cluster if cfg.kind == "page" and self.cuda_merge else 0
        self.cluster_ok = cl > 0 and splits >= cl
        if self.cluster_ok:  # whole clusters of splits per sequence
            splits -= splits % cl
        self.splits = splits
        self.min_tiles = min_tiles = max(1, math.ceil(cfg.min_split_tokens / TILE))
        self.need = workspace_numel(bsz, hq, d, splits)
        self.ml_off = 4 * bsz * hq * splits * d  # bytes from mid_o to mid_l
        self.scale: float | None = None
        split_vals = [0] * 6 + [0.0, bsz, hk, hq, splits, min_tiles, query.stride(0), query.stride(1),
                                block_table.stride(0), kv_cache.stride(0), kv_cache.stride(2)]
        if cfg.kind == "page":
            grid, block = bsz * splits, 32 * hk
            one_wave = grid <= k.blocks_per_sm(block) * sms
        else:
            grid, block = triton.cdiv(bsz * hk * splits, cfg.warps), 32 * cfg.warps
            one_wave = grid <= k.blocks_per_sm(block) * sms
        self.split = _cudart.Launch(k, grid, block, _SPLIT_SIG, split_vals)
        self.pdl_ok = one_wave and _capability(idx) >= (9, 0)
        self.fold_ok = cfg.kind == "page" and self.cuda_merge
        self.merge: _cudart.Launch | None = None
        self.merge_pdl: _cudart.Launch | None = None
        self.merge_rows: _cudart.Launch | None = None
        self.merge_rows_pdl: _cudart.Launch | None = None
        self.merged: _cudart.Launch | None = None
        self.clustered: _cudart.Launch | None = None
        self.gridded: _cudart.Launch | None = None
        self.write_lse = lse_stride0 is not None
        if self.cuda_merge:
            mk, rk = k.module.kernel(MERGE), k.module.kernel(MERGE_ROWS)
            o_sb, o_sh = out_strides
            vals = [0] * 5 + [hq, splits, min_tiles, o_sb, o_sh, lse_stride0 or 0, _OUT_KIND[out_dtype],
                              int(self.write_lse)]
            rgrid, rvals = -(-bsz * hq // MERGE_ROWS_PER_BLOCK), vals + [bsz * hq]  # a warp per row, the rows last
            self.merge = _cudart.Launch(mk, bsz * hq, 256, _MERGE_SIG, vals)
            self.merge_rows = _cudart.Launch(rk, rgrid, 256, _MERGE_ROWS_SIG, rvals)
            if self.pdl_ok:
                self.merge_pdl = _cudart.Launch(mk, bsz * hq, 256, _MERGE_SIG, vals, pdl=True)
                self.merge_rows_pdl = _cudart.Launch(rk, rgrid, 256, _MERGE_ROWS_SIG, rvals, pdl=True)
            if self.fold_ok:
                fk = k.module.kernel(MERGED, k.smem)
                self.merged = _cudart.Launch(fk, grid, block, _MERGED_SIG, split_vals + [
                    0, 0, 0, o_sb, o_sh, lse_stride0 or 0, _OUT_KIND[out_dtype], int(self.write_lse)])
                self.cnt_off = self.merged.offset(len(_SPLIT_SIG))
            if self.cluster_ok:
                ck = k.module.kernel(CLUSTERED, k.smem)
                self.clustered = _cudart.Launch(ck, grid, block, _MERGED_SIG, split_vals + [
                    0, 0, 0, o_sb, o_sh, lse_stride0 or 0, _OUT_KIND[out_dtype], int(self.write_lse)])
                self.cnt_off = self.clustered.offset(len(_SPLIT_SIG))
            if cfg.kind == "page" and cfg.grid_merge and hk == MERGE_WARPS and one_wave and not self.cluster_ok:
                gk = k.module.kernel(GRID, k.smem)
                if grid <= gk.blocks_per_sm(block) * sms:  # its merge's shared arrays count too
                    self.gridded = _cudart.Launch(gk, grid, block, _MERGED_SIG, split_vals + [
                        0, 0, 0, o_sb, o_sh, lse_stride0 or 0, _OUT_KIND[out_dtype], int(self.write_lse)],
                        cooperative=True)
                    self.cnt_off = self.gridded.offset(len(_SPLIT_SIG))
        self.own_ws: dict[int, torch.Tensor] = {}
        self.counters: dict[int, torch.Tensor] = {}

    def mode(self, capturing: bool) -> str:
        """The merge this plan runs now ("cluster", "grid", "cuda", "pdl", "fold" or "triton"): "cluster"
        or "grid" where the config asks for it and the plan could build it, else after MERGE_POLICY."""
        if self.clustered is not None:
            return "cluster"
        if self.gridded is not None:
            return "grid"
        want = MERGE_POLICY["graph" if capturing else "eager"]
        if want == "triton" and not capturing:
            want = "cuda"
        if not self.cuda_merge:
            return "triton"
        if want == "fold" and not self.fold_ok:
            want = "pdl"
        if want in ("pdl", "rows_pdl") and not self.pdl_ok:
            want = "cuda" if want == "pdl" else "rows"
        return want

    def workspace(self, stream: int) -> torch.Tensor:
        """This plan's own scratch on ``stream`` (allocated once)."""
        ws = self.own_ws.get(stream)
        if ws is None:
            ws = self.own_ws[stream] = torch.empty(self.need, dtype=torch.float32, device=f"cuda:{self.device}")
        return ws

    def counter(self, stream: int) -> int:
        """Device address of the folded / cluster / grid kernel's arrival counters on ``stream`` (one
        per sequence; grid: arrivals and departures per sequence; cluster: one per sequence and head
        slice)."""
        c = self.counters.get(stream)
        if c is None:
            n = max(1, self.bsz * max(2 if self.gridded is not None else 1, self.cfg.cluster))
            c = self.counters[stream] = torch.zeros(n, dtype=torch.int32, device=f"cuda:{self.device}")
        return c.data_ptr()

    def set_scale(self, scale: float) -> None:
        self.scale = scale
        _F32.pack_into(self.split.args, self.split.offset(6), scale * LOG2E)
        for m in (self.merged, self.clustered, self.gridded):
            if m is not None:
                _F32.pack_into(m.args, m.offset(6), scale * LOG2E)

    def launch(self, q: int, kv: int, bt: int, sl: int, out: int, lse: int, mo: int, stream: int, scale: float,
               mode: str) -> None:
        """Launch on raw pointers: the split kernel and the merge of ``mode`` (not "triton")."""
        if scale != self.scale:
            self.set_scale(scale)
        ml = mo + self.ml_off
        run = _cudart._LAUNCH_EX[0]
        if mode in ("fold", "cluster", "grid"):
            m = self.merged if mode == "fold" else self.clustered if mode == "cluster" else self.gridded
            assert m is not None  # mode() gives "fold" / "cluster" / "grid" only where it was built
            _PTRS6.pack_into(m.args, 0, q, kv, bt, sl, mo, ml)
            _PTRS3.pack_into(m.args, self.cnt_off, self.counter(stream), out, lse)
            _STREAM.pack_into(m.cfg, _cudart._CFG_STREAM, stream)
            rc = run(m.cfg_addr, m.func, m.params, None)
        else:
            sp = self.split
            _PTRS6.pack_into(sp.args, 0, q, kv, bt, sl, mo, ml)
            _STREAM.pack_into(sp.cfg, _cudart._CFG_STREAM, stream)
            rc = run(sp.cfg_addr, sp.func, sp.params, None)
            if rc:
                _cudart._check(rc, f"cuLaunchKernelEx({sp.kernel.name})")
            m = {"pdl": self.merge_pdl, "rows": self.merge_rows, "rows_pdl": self.merge_rows_pdl}.get(mode, self.merge)
            assert m is not None  # mode() gives "pdl" / "rows_pdl" / "cuda" / "rows" only where they were built
            _PTRS5.pack_into(m.args, 0, mo, ml, sl, out, lse)
            _STREAM.pack_into(m.cfg, _cudart._CFG_STREAM, stream)
            rc = run(m.cfg_addr, m.func, m.params, None)
        if rc:
            _cudart._check(rc, f"cuLaunchKernelEx({m.kernel.name})")


_LAUNCH_PLANS: dict[tuple, LaunchPlan] = {}


def launch_plan(query, kv_cache, block_table, out, lse, max_splits: int, config: CudaConfig | None = None) -> LaunchPlan:
    """The memoised :class:`LaunchPlan` of a call (builds kernels on first use)."""
    ok = out.dtype in _OUT_KIND and out.stride(2) == 1 and (lse is None or lse.stride(1) == 1)
    key = (_plan_key(query, kv_cache, config or DEFAULT), query.shape[0], block_table.stride(0), out.dtype,
           out.stride()[:2] if ok else None, None if lse is None else lse.stride(0), max_splits)
    p = _LAUNCH_PLANS.get(key)
    if p is None:
        p = _LAUNCH_PLANS[key] = LaunchPlan(query, kv_cache, block_table, out.dtype, out.stride()[:2] if ok else None,
                                            None if lse is None else lse.stride(0), max_splits, config)
    return p


def decode_attention(
    query: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor, seq_lens: torch.Tensor,
    scale: float, *, out: torch.Tensor, lse: torch.Tensor | None, workspace: torch.Tensor | None,
    max_splits: int, config: CudaConfig | None = None,
) -> torch.Tensor:
    """Split-KV decode on the CUDA kernels + a merge (``MERGE_POLICY``). Returns ``out``."""
    if query.shape[0] == 0:
        return out
    idx = device_index(query)
    if idx != torch.cuda.current_device():  # the module lives in that device's context
        with torch.cuda.device(idx):
            return decode_attention(query, kv_cache, block_table, seq_lens, scale, out=out, lse=lse,
                                    workspace=workspace, max_splits=max_splits, config=config)
    p = launch_plan(query, kv_cache, block_table, out, lse, max_splits, config)
    stream = torch.cuda.current_stream(query.device).cuda_stream
    ws = workspace_for(p, workspace, stream)
    mode = p.mode(torch.cuda.is_current_stream_capturing())
    if mode == "triton":
        flat = ws.view(-1)
        mid_o = flat[: p.bsz * p.hq * p.splits * p.d]
        mid_l = flat[p.bsz * p.hq * p.splits * p.d: p.need]
        launch_split(p.kernel, p.cfg, query, kv_cache, block_table, seq_lens, mid_o, mid_l, scale, p.splits,
                     p.min_tiles)
        launch_merge(query, seq_lens, mid_o, mid_l, out, lse, p.splits, p.min_tiles, p.kernel, cuda=False)
        return out
    p.launch(query.data_ptr(), kv_cache.data_ptr(), block_table.data_ptr(), seq_lens.data_ptr(), out.data_ptr(),
             0 if lse is None else lse.data_ptr(), ws.data_ptr(), stream, scale, mode)
    return out


def workspace_for(p: LaunchPlan, workspace: torch.Tensor | None, stream: int) -> torch.Tensor:
    """The caller's workspace when it holds the plan's scratch (float32, contiguous,
    16-byte aligned), else the plan's own on this stream."""
    if workspace is not None and workspace.dtype == torch.float32 and workspace.is_contiguous() \
            and workspace.numel() >= p.need and workspace.data_ptr() % 16 == 0:
        return workspace
    return p.workspace(stream)


def launch_split(k, cfg, query, kv_cache, block_table, seq_lens, mid_o, mid_l, scale, splits, min_tiles) -> None:
    """The CUDA split kernel alone: partial outputs and LSEs into mid_o / mid_l."""
    bsz, hq, _ = query.shape
    hk = kv_cache.shape[2]
    args = [
        C.c_void_p(query.data_ptr()), C.c_void_p(kv_cache.data_ptr()), C.c_void_p(block_table.data_ptr()),
        C.c_void_p(seq_lens.data_ptr()), C.c_void_p(mid_o.data_ptr()), C.c_void_p(mid_l.data_ptr()),
        C.c_float(scale * LOG2E), C.c_int(bsz), C.c_int(hk), C.c_int(hq), C.c_int(splits),
        C.c_int(min_tiles), C.c_longlong(query.stride(0)), C.c_longlong(query.stride(1)),
        C.c_longlong(block_table.stride(0)), C.c_longlong(kv_cache.stride(0)), C.c_longlong(kv_cache.stride(2)),
    ]
    stream = torch.cuda.current_stream(query.device).cuda_stream
    if cfg.kind == "page":
        k.launch(bsz * splits, 32 * hk, stream, args)
    else:
        k.launch(triton.cdiv(bsz * hk * splits, cfg.warps), 32 * cfg.warps, stream, args)


def launch_merge(query, seq_lens, mid_o, mid_l, out, lse, splits, min_tiles, k=None, cuda: bool | None = None) -> None:
    """Merge the splits with the CUDA merge of ``k``'s module or, with ``cuda=False``
    (default: while a CUDA graph is being captured), the Triton one."""
    bsz, hq, d = query.shape
    if cuda is None:
        cuda = not torch.cuda.is_current_stream_capturing()
    if cuda and k is not None and out.dtype in _OUT_KIND and out.stride(2) == 1 \
            and (lse is None or lse.stride(1) == 1):
        args = [
            C.c_void_p(mid_o.data_ptr()), C.c_void_p(mid_l.data_ptr()), C.c_void_p(seq_lens.data_ptr()),
            C.c_void_p(out.data_ptr()), C.c_void_p(lse.data_ptr() if lse is not None else 0),
            C.c_int(hq), C.c_int(splits), C.c_int(min_tiles), C.c_longlong(out.stride(0)),
            C.c_longlong(out.stride(1)), C.c_longlong(lse.stride(0) if lse is not None else 0),
            C.c_int(_OUT_KIND[out.dtype]), C.c_int(lse is not None),
        ]
        k.module.kernel(MERGE).launch(bsz * hq, 256, torch.cuda.current_stream(query.device).cuda_stream, args)
        return
    from .kernels import _merge_kernel  # the Triton merge (one-way import: kernels never imports this module)

    _merge_kernel[(bsz, hq)](
        mid_o, mid_l, seq_lens, out, lse if lse is not None else mid_l,
        splits, min_tiles,
        out.stride(0), out.stride(1), lse.stride(0) if lse is not None else 0,
        HQ=hq, D=d, BLOCK_N=TILE, BLOCK_S=max(2, triton.next_power_of_2(splits)),
        WRITE_LSE=lse is not None,
        num_warps=4 if d >= 128 else 2,
    )


def mark_broken(idx: int, why: str) -> None:
    """Turn the CUDA backend off on one device for this process (logged once)."""
    if idx not in _BROKEN:
        _BROKEN[idx] = why
        _LAUNCH_PLANS.clear()
        LOG.warning("sndr: TurboQuant CUDA decode disabled on cuda:%d, using Triton: %s", idx, why)
