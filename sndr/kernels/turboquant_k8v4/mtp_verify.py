"""Speculative-verify (multi-query) decode on the TurboQuant k8v4 cache.

A verify step of MTP / draft-model speculative decoding is a uniform batch of
``QL = K + 1`` query tokens per request; token ``t`` of a request sees the
first ``seq_len - K + t`` cached tokens. vLLM 0.32.0 runs it as ``QL`` single
rows per request through its decode kernel, reading the request's KV ``QL``
times. :func:`verify_attention` reads it once:

* CUDA (sm_90, the cache rows TMA can copy): by default the warpgroup-MMA kernel of :mod:`.verify_wg`
  (all rows of a KV head in one m64 wgmma tile) from 17 rows per KV head, and below that at the small
  batches where it measured faster (:func:`verify_wg.uses`); else ``verify_k8v4.cu``, compiled by NVRTC
  with ``decode_k8v4.cu`` (whose page-kernel ring, fragment loaders and merges it reuses), the rows the n
  dimension of the score MMA: up to 16 rows a warp per KV head, a block per (request, split); more rows
  (:func:`block_plan`) wide warps of up to 32 rows or the shared-tile CTA (16-row warps on one
  TMA-copied tile). Split-KV, then ``decode_k8v4.cu``'s merge. Opt-in (``VerifyConfig.ws``, measured
  slower): the warp-specialised pair, a score warp and a P.V warp per KV head where the wide warps run.
* otherwise: ``B * QL`` synthetic single-token rows through PK0001's
  :func:`dispatch.decode_attention` (CUDA or Triton; Triton's interpreter on the
  CPU), with lengths ``seq_len - K + t`` built on the device.

Both are fixed-grid, host-sync-free and CUDA-graph capturable: the split count depends on the batch
shape only, lengths are read on the device. A shape seen first inside a capture records the synthetic
path (building means NVRTC and module loading); :func:`prepare` builds ahead from shapes alone, which
the vLLM routing of patch PK0002 does when the metadata builder is created.

``SNDR_TQ_BACKEND`` (``auto``, ``cuda``, ``triton``) is PK0001's switch: ``triton`` never uses the CUDA
verify kernel, ``cuda`` raises where it cannot run instead of falling back.
"""

from __future__ import annotations

import ctypes as C
import functools
import logging
import math
from dataclasses import dataclass
from pathlib import Path

import torch

from ... import env as sndr_env
from .. import _cudart
from . import verify_wg
from ._layout import LOG2E, Layout
from .cuda_decode import MERGE_ROWS, MERGE_ROWS_PER_BLOCK

DECODE_SOURCE = Path(__file__).with_name("decode_k8v4.cu")
SOURCE_PATH = Path(__file__).with_name("verify_k8v4.cu")
KERNEL = "tq_k8v4_verify_page"
MERGE = "tq_k8v4_merge"
TILE = 16
MAX_SPLITS = 128  # the merge kernel's limit
MERGE_ROWS_MAX_SPLITS = 16  # VerifyConfig.merge_rows: the warp-per-row merge up to this many splits a request
MAX_QL = 16
LOG = logging.getLogger("sndr.kernels")

__all__ = ["VerifyConfig", "verify_attention", "prepare", "synthetic_rows", "unsupported",
           "num_splits", "row_chunks", "defines", "source"]


@dataclass(frozen=True)
class VerifyConfig:
    stages: int = 3  # TMA ring depth (16-token tiles of all heads)
    min_blocks: int = 2  # blocks of 8 warps per SM asked of the register allocator (halved at > 8 rows)
    tau: float = 8.0  # lazy-rescale slack, log2 units
    min_split_tokens: int = 32  # a request gets at most one split per this many tokens
    waves: int = 1  # the split count aims at this many full waves of blocks
    max_splits: int = 128  # may exceed the caller's cap
    qsmem: int = -1  # Q fragments in shared memory: 1, 0, -1 = where a warp holds more than 8 rows
    # The shared-tile CTA (G (K + 1) > 16 rows per KV head): warps per KV head in one block, each 16 rows,
    # all on the same TMA-copied tile. -1: every row chunk (up to max_warps per block), 1: the one-warp-per-
    # head kernel with one block per row chunk (today's kernel, always used at <= 16 rows).
    chunk_warps: int = -1
    heads_per_block: int = 0  # 0: all KV heads where HK * chunk warps <= max_warps, else the largest group that fits
    max_warps: int = 16  # warps per block of the shared-tile CTA (16 x 128 registers fill the register file)
    # score MMA accumulator chains per n-tile: 2 (even / odd k-steps) halves the dependent MMA chain, but measured
    # up to 7.8% slower in 20 of 24 probed cells on the H200 (docs/bench-mtp-verify-h200.md, probe), so 1
    kchain: int = 1
    # 1: the shared-unpack CTA (verify_k8v4.cu, SHU) where the shared-tile CTA runs: each tile unpacked once per
    # block into shared memory, read with ldmatrix; measured 1.2-1.5x SLOWER than per-warp unpacking in all 20
    # probed cells (docs/bench-mtp-verify-h200.md). unpack_heads: KV heads per block it aims at.
    unpack: int = 0
    unpack_heads: int = 4
    unpack_buffers: int = 0  # 1 or 2 unpacked tiles; 0: 2 where that costs no block per SM, else 1
    # Query rows per warp: 16 (two n-tiles of 8), 32 (a wide warp: up to four n-tiles on the tile it unpacks once
    # in registers; about 240 registers, so at most 8 warps a block and 8 per SM), or 0: 32 where G (K + 1) is
    # 17..32 or a multiple of 32 (whole wide warps), else 16. Measured on the H200 (docs/bench-mtp-verify-h200.md,
    # one run): wide warps 1.2-15.7% faster in all 32 cells with 24, 32 or 64 rows per KV head, 2.8-10.2%
    # slower in the 8 cells with 48 (a half-empty second warp).
    rows_per_warp: int = 0
    wide_heads: int = 4  # KV heads per block of one-warp-per-head wide warps (where their row bytes align)
    # The per-warp kernel's per-score softmax (verify_k8v4.cu's SMX): 0 softmax_tile (decode_k8v4.cu's);
    # 1 softmax_tile_mma (one FFMA a score, one max test a tile, l and z by one MMA per n-tile: 422 -> 347
    # SASS instructions a tile at G = 8 K = 3); 2 the same with ex2.approx.f16x2 (no fewer MUFU on sm_90).
    # -1: 1 where G (K + 1) > 16 at head dim 128, else 0 (1 measured 2.8-5.6% faster than 0 in all 20 probed
    # cells: docs/bench-mtp-verify-h200.md, "Round 3"). The shared-unpack CTA always runs 0.
    softmax: int = -1
    # 1: the warp-specialised pair (verify_k8v4.cu, WSP, sm_90a) where the wide-warp plan runs one row chunk per
    # KV head: a score warp and a P.V warp per KV head on one TMA ring, registers moved by setmaxnreg (ws_regs:
    # score, P.V registers per thread, summing to 256); ws_stages: its ring depth. Measured slower (round 4).
    ws: int = 0
    ws_regs: tuple[int, int] = (88, 168)
    ws_stages: int = 4
    # The merge of the splits: 1 decode_k8v4.cu's tq_k8v4_merge_rows (a warp per output row) where a request has at
    # most MERGE_ROWS_MAX_SPLITS splits, else (and with 0) its tq_k8v4_merge (a block per row): the warp merge is
    # faster at 4 and 16 splits, slower at 33-128 (docs/bench-mtp-verify-h200.md, "Round 6").
    merge_rows: int = 1
    # The warpgroup-MMA kernels (verify_wgmma.cu, sm_90a; verify_wg.py): a block per (request, split, KV head), all
    # QL * G <= 64 rows of the KV head in one m64 wgmma tile, each tile's keys and values converted once into f16
    # operands (by default by a converting warpgroup for an MMA warpgroup). -1 (the default): at verify_wg.MIN_ROWS
    # (17)..64 rows per KV head, fewer at small batches (SMALL_BATCH); 1: 17..64; 2: 1..64; 0: never (uses).
    wgmma: int = -1
    wg: verify_wg.WgConfig = verify_wg.WgConfig()


DEFAULT = VerifyConfig()


def per_warp(**kw) -> VerifyConfig:
    """A config of the per-warp kernel (verify_k8v4.cu) at every row count: ``wgmma=0``, else 17..64 rows per KV
    head run the warpgroup-MMA kernel and the variant is neither tested nor timed there."""
    return VerifyConfig(wgmma=0, **kw)


_SOURCE: list[str] = []
_PLANS: dict[tuple, tuple] = {}
_BROKEN: dict[int, str] = {}


def source() -> str:
    """decode_k8v4.cu then verify_k8v4.cu (with a #line so errors name the right file)."""
    if not _SOURCE:
        _SOURCE.append(DECODE_SOURCE.read_text() + '\n#line 1 "verify_k8v4.cu"\n' + SOURCE_PATH.read_text())
    return _SOURCE[0]


def row_chunks(ql: int, g: int, max_rows: int = 16) -> tuple[int, int]:
    """(rows per warp, chunks): QL * G query rows per KV head in warps of at most ``max_rows`` rows."""
    rows = ql * g
    rc = min(rows, max_rows)
    return rc, -(-rows // rc)


@dataclass(frozen=True)
class BlockPlan:
    """How one (request, split) is cut into blocks: ``hpb`` KV heads x ``ncw`` row-chunk warps per block,
    ``nhg`` head groups x ``nchb`` chunk blocks of them. ``hpb == hk and ncw == 1``: the one-warp-per-head kernel."""
    rc: int
    nch: int
    hpb: int
    ncw: int
    shu: bool = False  # the shared-unpack CTA
    ubuf: int = 2  # its unpacked tiles: 2 (one barrier per tile), 1 (two; where 2 would cost a block per SM)
    ws: bool = False  # the warp-specialised pair: a score warp and a P.V warp per KV head

    @property
    def nchb(self) -> int:
        return -(-self.nch // self.ncw)

    @property
    def warps(self) -> int:
        return self.hpb * self.ncw * (2 if self.ws else 1)

    def blocks(self, hk: int) -> int:
        """Blocks per (request, split)."""
        return (hk // self.hpb) * self.nchb


def block_plan(hq: int, hk: int, d: int, ql: int, sp: int, hs: int, cfg: VerifyConfig = DEFAULT) -> BlockPlan:
    """The kernel for a shape: the one-warp-per-head kernel where G (K + 1) <= 16 (or the head dim is outside
    :data:`dispatch.VERIFY_SHARED_TILE_HEAD_DIMS`); wide warps (``cfg.rows_per_warp``) where G (K + 1) is 17..32
    (one warp per KV head, ``wide_heads`` heads a block) or a multiple of 32 (the shared-tile CTA of 32-row warps);
    else the shared-tile CTA of 16-row warps (``cfg.unpack``: its shared-unpack form). A head group smaller than
    Hk copies part of each token row, which needs 16-byte aligned pieces (``sp`` and ``hpb * hs`` multiples of
    16)."""
    from .dispatch import VERIFY_SHARED_TILE_HEAD_DIMS

    rows = ql * (hq // hk)
    rpw = cfg.rows_per_warp or (32 if 16 < rows and (rows <= 32 or rows % 32 == 0) else 16)
    wide = rpw > 16 and cfg.chunk_warps != 1 and not cfg.unpack and d in VERIFY_SHARED_TILE_HEAD_DIMS
    rc, nch = row_chunks(ql, hq // hk, 32 if wide else 16)

    def aligned(h: int) -> bool:
        return h == hk or (sp % 16 == 0 and (h * hs) % 16 == 0)

    if wide and nch == 1:
        h = cfg.heads_per_block or cfg.wide_heads
        h = h if 0 < h <= hk and hk % h == 0 and aligned(h) else hk
        ws = bool(cfg.ws) and d == 128 and cfg.softmax in (-1, 1) and cfg.qsmem != 0 and h % 4 == 0 and h <= 8
        return BlockPlan(rc, nch, h, 1, ws=ws)
    if nch == 1 or cfg.chunk_warps == 1 or d not in VERIFY_SHARED_TILE_HEAD_DIMS:
        return BlockPlan(rc, nch, hk, 1)
    mw = max(1, min(cfg.max_warps, 8) if rc > 16 else cfg.max_warps)
    ncw = min(nch, mw) if cfg.chunk_warps < 0 else max(1, min(cfg.chunk_warps, nch, mw))

    if cfg.unpack:
        # the shared-unpack CTA: the requested head group, else the largest aligned group up to unpack_heads,
        # else larger ones; each with as many chunk warps as fit max_warps and the shared memory
        want = cfg.heads_per_block or max(1, cfg.unpack_heads)
        divs = [h for h in range(hk, 0, -1) if hk % h == 0 and aligned(h)]
        for h in [h for h in divs if h <= want] + [h for h in reversed(divs) if h > want]:
            n = min(ncw, mw // h)
            cbh = sp if h == hk else h * hs
            fit = {u: smem_bytes(cfg, cbh, h * n, rc, d, h, u) for u in (2, 1)}
            if n < 1 or fit[1] > SMEM_MAX:
                continue
            per_sm = {u: min(min_blocks(cfg, h * n, rc, d, True), SMEM_SM // (fit[u] + 1024)) if fit[u] <= SMEM_MAX
                      else 0 for u in fit}
            ubuf = cfg.unpack_buffers or (2 if per_sm[2] >= per_sm[1] else 1)
            if fit[ubuf] <= SMEM_MAX:
                return BlockPlan(rc, nch, h, n, True, ubuf)

    if cfg.heads_per_block and hk % cfg.heads_per_block == 0 and aligned(cfg.heads_per_block):
        hpb = cfg.heads_per_block
    elif hk * ncw <= mw:
        hpb = hk
    else:
        fits = [h for h in range(hk, 0, -1) if hk % h == 0 and h * ncw <= mw and aligned(h)]
        hpb = fits[0] if fits else hk
    ncw = max(1, min(ncw, mw // hpb))
    return BlockPlan(rc, nch, hpb, ncw)


def row_pitch(sp: int) -> tuple[int, int]:
    """(ROWP, ROWCOPY): as the page kernel (cuda_decode.row_pitch), rows padded to 4 or 12 words mod 16."""
    if sp % 16:
        return sp, 0
    p = sp
    while p % 16 or (p // 4) % 16 not in (4, 12):
        p += 4
    return p, 1


def q_in_smem(cfg: VerifyConfig, rc: int) -> bool:
    return bool(cfg.qsmem) if cfg.qsmem >= 0 else rc > 8


SMEM_MAX = 227 * 1024  # dynamic shared memory one block may ask for on sm_90
SMEM_SM = 228 * 1024  # shared memory of an SM (1 KB of it reserved per block)


def smem_bytes(cfg: VerifyConfig, cb: int, warps: int = 0, rc: int = 0, d: int = 128, unpack_heads: int = 0,
               ubuf: int = 2, ws_heads: int = 0) -> int:
    """Dynamic shared memory: the ring of 16-row stages of ``cb`` bytes per row, its barriers, and the Q
    fragments of ``warps`` warps where they live in shared memory; with ``unpack_heads`` (the shared-unpack
    CTA) then ``ubuf`` unpacked f16 tiles of that many KV heads (verify_k8v4.cu's UOFF, UHEAD); with
    ``ws_heads`` (the warp-specialised pair: ``warps`` counts its score warps) then two hand-off buffers per
    KV head (XWORDS words per lane each)."""
    stages = cfg.ws_stages if ws_heads else cfg.stages
    ring = stages * 16 * row_pitch(cb)[0] + 16 * stages
    if warps and q_in_smem(cfg, rc):
        ring += warps * ((rc + 7) // 8) * (d // 16) * 2 * 32 * 4  # NH x KSTEPS x 2 words per lane
    if ws_heads:
        return ring + ws_heads * 2 * (4 * ((rc + 7) // 8) + 1) * 32 * 4
    if unpack_heads:
        return -(-ring // 128) * 128 + ubuf * unpack_heads * (32 * (d + 8) * 2 + 64)
    return ring


def min_blocks(cfg: VerifyConfig, warps: int, rc: int, d: int, shu: bool = False, ws: bool = False) -> int:
    """Blocks per SM asked of the register allocator (``warps`` per block): more than 8 rows per warp hold
    twice the accumulators; with Q in shared memory they still fit 16 warps per SM (no spills). The
    shared-unpack CTA (Q in registers, no key/value words held) fits 16 warps per SM at D <= 128."""
    n = max(1, (cfg.min_blocks * 8) // warps)
    if ws:  # the warp-specialised pair: 16 warps per SM, the launch's 128 registers split by setmaxnreg
        return max(1, 16 // warps)
    if shu:
        return min(n, 2)
    if rc > 16:  # three or four n-tiles: about 240 registers (170 spill), so 8 warps per SM
        return 1
    if d > 128:
        n = max(1, n // 2)
    return n if rc <= 8 or q_in_smem(cfg, rc) and d <= 128 else max(1, n // 2)


def copy_bytes(plan: BlockPlan, hk: int, sp: int, hs: int) -> int:
    """Bytes of each token row a block copies: the whole row, or its head group's slots."""
    return sp if plan.hpb == hk else plan.hpb * hs


def defines(hq: int, hk: int, d: int, page: int, sp: int, bf16: bool, ql: int,
            cfg: VerifyConfig = DEFAULT, hs: int | None = None) -> dict[str, int | str]:
    """NVRTC macros of one build. ``hs``: bytes between two KV heads' slots (default: the aligned slot)."""
    g = hq // hk
    hs = Layout(d).slot_size_aligned if hs is None else hs
    plan = block_plan(hq, hk, d, ql, sp, hs, cfg)
    cb = copy_bytes(plan, hk, sp, hs)
    rowp, rowcopy = row_pitch(cb)
    if plan.hpb < hk:
        rowcopy = 1  # block_plan only splits heads where sp is a multiple of 16
    smx = cfg.softmax if cfg.softmax >= 0 else int(ql * g > 16 and d == 128)
    ws: dict[str, int | str] = {}
    if plan.ws:  # setmaxnreg: multiples of 8 in [24, 256] that split the launch's registers (2 x 128 a thread)
        budget = 65536 // (32 * plan.warps * min_blocks(cfg, plan.warps, plan.rc, d, ws=True))
        if sum(cfg.ws_regs) != 2 * budget or any(r % 8 or not 24 <= r <= 256 for r in cfg.ws_regs):
            raise ValueError(f"ws_regs={cfg.ws_regs}: two multiples of 8 in [24, 256] summing to {2 * budget}")
        ws = {"WSP": 1, "WS_SREG": cfg.ws_regs[0], "WS_PREG": cfg.ws_regs[1]}
    return ws | {
        "D": d, "SP": sp, "PAGE": page, "G": plan.rc, "QBF16": int(bf16),
        "STAGES": cfg.ws_stages if plan.ws else cfg.stages, "NW": 1,
        "MINB": min_blocks(cfg, plan.warps, plan.rc, d, plan.shu, plan.ws), "TAU": f"{float(cfg.tau)!r}f",
        "PAGE_CTA": 1,
        "HK": hk, "ROWP": rowp, "ROWCOPY": rowcopy,
        "QL": ql, "GQ": g, "RC": plan.rc, "NCH": plan.nch, "QSMEM": int(q_in_smem(cfg, plan.rc)),
        "HPB": plan.hpb, "NCW": plan.ncw, "NCHB": plan.nchb, "CB": cb, "HS": hs if plan.hpb < hk else 0,
        "KCHAIN": cfg.kchain, "SHU": int(plan.shu), "UBUF": plan.ubuf, "SMX": 0 if plan.shu else smx,
    }


def arch_suffix(defs: dict[str, int | str]) -> str:
    """"a" (sm_90a, for setmaxnreg) for the warp-specialised pair's builds, else ""."""
    return "a" if defs.get("WSP") else ""


# the device facts have one home (_cudart); these names are this module's seams (tests set them)
_device_index = _cudart.device_index
_capability = _cudart.capability
_sm_count = _cudart.sm_count


def shape_problem(query: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor,
                  seq_lens: torch.Tensor, num_spec: int) -> str | None:
    """What in the call the CUDA verify kernel cannot take (None: nothing). No device access."""
    if query.dim() != 3 or kv_cache.dim() != 4:
        return "query must be [tokens, Hq, D] and the cache [blocks, page, Hk, slot]"
    n, hq, d = query.shape
    hk = kv_cache.shape[2]
    ql = num_spec + 1
    if not 1 <= ql <= MAX_QL:
        return f"{num_spec} speculative tokens (at most {MAX_QL - 1})"
    if d not in (64, 128, 256):
        return f"head dim {d} (64, 128 or 256 only)"
    if hk == 0 or hq % hk or not 1 <= hq // hk <= 16:
        return f"group size Hq/Hk = {hq}/{hk}"
    if hk > 16:
        return f"{hk} KV heads (a block holds one warp per KV head, at most 16)"
    if kv_cache.shape[3] < Layout(d).slot_size:
        return f"cache slot {kv_cache.shape[3]} bytes < {Layout(d).slot_size}"
    if kv_cache.shape[1] % TILE:
        return f"page size {kv_cache.shape[1]} is not a multiple of {TILE}"
    if query.dtype not in (torch.float16, torch.bfloat16):
        return f"query dtype {query.dtype}"
    if query.stride(2) != 1 or query.stride(0) % 2 or query.stride(1) % 2 or query.data_ptr() % 4:
        return "query rows not 4-byte aligned"
    if kv_cache.dtype != torch.uint8 or kv_cache.stride(3) != 1:
        return "cache not uint8 with contiguous slots"
    st = kv_cache.stride()
    slot = kv_cache.shape[3]
    if kv_cache.data_ptr() % 16 or st[0] % 16 or st[2] < slot or st[1] < st[2] * (hk - 1) + slot \
            or st[2] % 4 or st[1] % 4:
        return "cache rows not whole, 16-byte aligned token rows (the TMA copies need them)"
    if block_table.dtype != torch.int32 or block_table.dim() != 2 or block_table.stride(1) != 1:
        return "block table not int32 rows"
    if seq_lens.dtype != torch.int32 or seq_lens.dim() != 1 or not seq_lens.is_contiguous():
        return "seq_lens not contiguous int32"
    if n % ql:
        return f"{n} query tokens is not a multiple of {ql} per request"
    return None


def unsupported(query, kv_cache, block_table, seq_lens, num_spec) -> str | None:
    """Why the CUDA verify kernel cannot take this call (None: it can)."""
    return (_cudart.device_refusal(query, (9, 0), "needs sm_90 (TMA bulk copies); sm_89 uses the synthetic rows",
                                   _BROKEN)
            or shape_problem(query, kv_cache, block_table, seq_lens, num_spec))


def _key(idx, dtype, hq, hk, d, page, sp, hs, ql, cfg, wg: bool = False) -> tuple:  # (wg: verify_wgmma.cu)
    return (idx, dtype, hq, hk, d, page, sp, hs, ql, cfg, wg)


def _build(key) -> tuple:
    idx, dtype, hq, hk, d, page, sp, hs, ql, cfg, wg = key
    defs = defines(hq, hk, d, page, sp, dtype == torch.bfloat16, ql, cfg, hs)
    if wg:  # the warpgroup-MMA kernel: a block per KV head
        k = verify_wg.load(DECODE_SOURCE, idx, hq, hk, d, page, hs, ql, cfg.wg, defs)
        merge = (k.module.kernel(MERGE_ROWS), k.module.kernel(MERGE))
        return k, merge, max(1, k.blocks_per_sm(cfg.wg.threads)), hk, cfg.wg.threads // 32, True
    plan = block_plan(hq, hk, d, ql, sp, hs, cfg)
    smem = smem_bytes(cfg, copy_bytes(plan, hk, sp, hs), plan.hpb if plan.ws else plan.warps, plan.rc, d,
                      plan.hpb if plan.shu else 0, plan.ubuf, plan.hpb if plan.ws else 0)
    k = _cudart.load_kernel(source(), KERNEL, defs, idx, smem, label="verify_k8v4", arch_suffix=arch_suffix(defs))
    merge = (k.module.kernel(MERGE_ROWS), k.module.kernel(MERGE))  # _launch picks by the split count
    return k, merge, max(1, k.blocks_per_sm(32 * plan.warps)), plan.blocks(hk), plan.warps, False


def prepare(device: torch.device | int, dtype: torch.dtype, num_heads: int, num_kv_heads: int, head_dim: int,
            page: int, num_spec: int, row_stride: int | None = None, config: VerifyConfig | None = None) -> bool:
    """Build and load the verify kernel for a model shape ahead of any call (e.g. before a
    CUDA-graph capture). ``row_stride``: bytes between token rows of a page (default Hk * slot).
    Returns False (and logs) where the CUDA kernel cannot serve this shape or failed to build. Builds the
    warpgroup-MMA kernel too where it serves the shape (:func:`verify_wg.maps_for`)."""
    idx = device if isinstance(device, int) else _device_index(device)
    sp = row_stride if row_stride is not None else num_kv_heads * Layout(head_dim).slot_size_aligned
    hs = Layout(head_dim).slot_size_aligned
    cfg = config or DEFAULT
    keys = [_key(idx, dtype, num_heads, num_kv_heads, head_dim, page, sp, hs, num_spec + 1, cfg)]
    if verify_wg.uses(cfg, num_heads, num_kv_heads, head_dim, num_spec + 1, sp, page * sp):
        keys.append(_key(idx, dtype, num_heads, num_kv_heads, head_dim, page, sp, hs, num_spec + 1, cfg, True))
    if all(k in _PLANS for k in keys):
        return True
    try:
        if sndr_env.tq_backend() == "triton" or _cudart.device_refusal(torch.device("cuda", idx), (9, 0), "sm_90"):
            return False
        for k in keys:
            if k not in _PLANS:
                _PLANS[k] = _build(k)
        return True
    except (_cudart.CudaUnavailable, _cudart.CudaError) as exc:
        mark_broken(idx, str(exc).splitlines()[0])
        return False


def mark_broken(idx: int, why: str) -> None:
    if idx not in _BROKEN:
        _BROKEN[idx] = why
        LOG.warning("sndr: TurboQuant CUDA verify kernel disabled on cuda:%d, using synthetic rows: %s", idx, why)


@functools.lru_cache(maxsize=4096)
def num_splits(blocks_wanted: int, blocks_per_sm: int, sms: int, max_splits: int, waves: int = 1) -> int:
    """Splits per request from the launch shape only (CUDA-graph safe): about ``waves`` full
    waves of blocks, where ``blocks_wanted`` blocks run per split; capped at ``max_splits``."""
    slots = blocks_per_sm * sms
    want = (waves * slots) // max(1, blocks_wanted)
    if want <= max_splits:
        return max(1, want)
    return max(range(1, max_splits + 1),
               key=lambda s: (blocks_wanted * s / (-(-blocks_wanted * s // slots) * slots), s))


def _capturing() -> bool:
    try:
        return torch.cuda.is_current_stream_capturing()
    except (RuntimeError, AssertionError):
        return False


_OUT_KIND = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}


def verify_attention(
    query: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor, seq_lens: torch.Tensor,
    scale: float, num_spec: int, *, out: torch.Tensor | None = None, workspace: torch.Tensor | None = None,
    max_splits: int = MAX_SPLITS, config: VerifyConfig | None = None,
) -> torch.Tensor:
    """Attention of ``B * (K + 1)`` query tokens over their requests' k8v4 caches.

    query: [B * (K + 1), Hq, D] fp16/bf16, token-major per request (rows b*(K+1) .. b*(K+1)+K);
    block_table: [>= B, max_blocks] int32; seq_lens: [>= B] int32, each request's length
    *including* its K + 1 new tokens. Row t of request b attends to tokens
    [0, seq_lens[b] - K + t) (none: zeros). Returns ``out`` ([B * (K + 1), Hq, D], query dtype
    unless ``out`` is given).
    """
    if num_spec < 0:
        raise ValueError(f"num_spec={num_spec} must be >= 0")
    n, hq, d = query.shape
    ql = num_spec + 1
    if n % ql:
        raise ValueError(f"{n} query tokens is not a multiple of K + 1 = {ql}")
    b = n // ql
    if seq_lens.shape[0] < b or block_table.shape[0] < b:
        raise ValueError(f"{b} requests but {seq_lens.shape[0]} lengths, {block_table.shape[0]} block-table rows")
    if out is None:
        out = torch.empty(n, hq, d, dtype=query.dtype, device=query.device)
    if n == 0:
        return out
    choice = sndr_env.tq_backend()
    if choice != "triton":
        why = unsupported(query, kv_cache, block_table, seq_lens, num_spec)
        if why is None and out.stride(2) == 1 and out.stride(0) == hq * out.stride(1) and out.dtype in _OUT_KIND:
            idx = _device_index(query)
            cfg = config or DEFAULT
            maps = verify_wg.maps_for(cfg, idx, hq, d, ql, kv_cache, b)  # (None: the per-warp kernel)
            key = _key(idx, query.dtype, hq, kv_cache.shape[2], d, kv_cache.shape[1], kv_cache.stride(1),
                       kv_cache.stride(2), ql, cfg, maps is not None)
            if key not in _PLANS and _capturing():
                if choice == "cuda":
                    raise RuntimeError("SNDR_TQ_BACKEND=cuda: first verify call of this shape inside a CUDA-graph "
                                       "capture; call mtp_verify.prepare() or run it once eagerly first")
            else:
                try:
                    if key not in _PLANS:
                        _PLANS[key] = _build(key)
                    _launch(_PLANS[key], cfg, query, kv_cache, block_table, seq_lens, scale, out, workspace,
                            b, max_splits, maps)
                    return out
                except (_cudart.CudaUnavailable, _cudart.CudaError) as exc:
                    if choice == "cuda":
                        raise
                    if key[10]:  # the wgmma kernel failed: off on this device, the per-warp kernel instead
                        verify_wg.disable(idx, str(exc).splitlines()[0])
                        return verify_attention(query, kv_cache, block_table, seq_lens, scale, num_spec, out=out,
                                                workspace=workspace, max_splits=max_splits, config=config)
                    mark_broken(idx, str(exc).splitlines()[0])
        elif choice == "cuda":
            raise ValueError(f"SNDR_TQ_BACKEND=cuda: verify kernel cannot take the call: "
                             f"{why or 'output not [tokens, Hq, D] contiguous rows'}")
    return synthetic_rows(query, kv_cache, block_table, seq_lens, scale, num_spec, out=out, max_splits=max_splits)


def _args(query, kv_cache, block_table, seq_lens, mid_o, mid_l, scale, b, splits, min_tiles) -> list:
    return [  # the per-warp kernels' parameters (VERIFY_PARAMS of verify_k8v4.cu)
        C.c_void_p(query.data_ptr()), C.c_void_p(kv_cache.data_ptr()), C.c_void_p(block_table.data_ptr()),
        C.c_void_p(seq_lens.data_ptr()), C.c_void_p(mid_o.data_ptr()), C.c_void_p(mid_l.data_ptr()),
        C.c_float(scale * LOG2E), C.c_int(b), C.c_int(splits), C.c_int(min_tiles),
        C.c_longlong(query.stride(0)), C.c_longlong(query.stride(1)), C.c_longlong(block_table.stride(0)),
        C.c_longlong(kv_cache.stride(0)), C.c_longlong(kv_cache.stride(2)),
    ]


def _launch(plan, cfg, query, kv_cache, block_table, seq_lens, scale, out, workspace, b, max_splits,
            maps=None) -> None:
    k, merge, blocks_per_sm, per_split, warps, wg = plan
    n, hq, d = query.shape
    ql, idx = n // b, _device_index(query)
    splits = num_splits(b * per_split, blocks_per_sm, _sm_count(idx), min(MAX_SPLITS, max(max_splits, cfg.max_splits)),
                        cfg.waves)
    min_tiles = max(1, math.ceil(cfg.min_split_tokens / TILE))
    rows = n * hq
    need = rows * splits * (d + 1)
    if workspace is None or workspace.numel() < need or workspace.dtype != torch.float32 \
            or not workspace.is_contiguous() or workspace.data_ptr() % 16:
        workspace = torch.empty(need, dtype=torch.float32, device=query.device)
    flat = workspace.view(-1)
    mid_o = flat[: rows * splits * d]
    mid_l = flat[rows * splits * d: need]
    stream = torch.cuda.current_stream(query.device).cuda_stream
    if wg:
        args = verify_wg.launch_args(maps, query, block_table, seq_lens, mid_o, mid_l, scale * LOG2E, splits,
                                     min_tiles)
    else:
        args = _args(query, kv_cache, block_table, seq_lens, mid_o, mid_l, scale, b, splits, min_tiles)
    margs = [
        C.c_void_p(mid_o.data_ptr()), C.c_void_p(mid_l.data_ptr()), C.c_void_p(seq_lens.data_ptr()),
        C.c_void_p(out.data_ptr()), C.c_void_p(0), C.c_int(ql * hq), C.c_int(splits), C.c_int(min_tiles),
        C.c_longlong(ql * out.stride(0)), C.c_longlong(out.stride(1)), C.c_longlong(0),
        C.c_int(_OUT_KIND[out.dtype]), C.c_int(0),
    ]
    # tq_k8v4_merge_rows: a warp per row, its ROWS last (few splits); tq_k8v4_merge: a block of 256 threads per row
    by_rows = bool(cfg.merge_rows) and splits <= MERGE_ROWS_MAX_SPLITS
    merge = merge[0] if by_rows else merge[1]
    mgrid = -(-rows // MERGE_ROWS_PER_BLOCK) if by_rows else rows
    if by_rows:
        margs.append(C.c_int(rows))
    if idx != torch.cuda.current_device():
        with torch.cuda.device(idx):
            k.launch(b * splits * per_split, 32 * warps, stream, args)
            merge.launch(mgrid, 256, stream, margs)
        return
    k.launch(b * splits * per_split, 32 * warps, stream, args)
    merge.launch(mgrid, 256, stream, margs)


def synthetic_lengths(seq_lens: torch.Tensor, b: int, num_spec: int) -> torch.Tensor:
    """[B * (K + 1)] int32: seq_len - K + t per row, clamped at 0 (device ops only)."""
    ql = num_spec + 1
    t = torch.arange(ql, device=seq_lens.device, dtype=torch.int32)
    return (seq_lens[:b, None].to(torch.int32) - num_spec + t).clamp_min(0).reshape(-1)


def synthetic_rows(query, kv_cache, block_table, seq_lens, scale, num_spec, *, out=None,
                   max_splits: int = 64) -> torch.Tensor:
    """The same result as B * (K + 1) single-token decodes through PK0001's decode_attention
    (CUDA page/warp kernel or Triton): every request's KV is read K + 1 times."""
    from . import dispatch

    n = query.shape[0]
    ql = num_spec + 1
    b = n // ql
    sl = synthetic_lengths(seq_lens, b, num_spec)
    bt = block_table[:b].repeat_interleave(ql, dim=0)
    return dispatch.decode_attention(query, kv_cache, bt, sl, scale, out=out, max_splits=max_splits)


def precompile(shapes, arch: str | None = None, workers: int = 8) -> int:
    """Compile the verify module for many shapes at once into the on-disk cubin cache (NVRTC runs
    in threads; loading later takes the cached cubins). shapes: (hq, hk, d, page, sp, bf16, ql[, cfg])."""
    from concurrent.futures import ThreadPoolExecutor

    if arch is None:
        major, minor = _capability(torch.cuda.current_device())
        arch = f"{major}{minor}"
    jobs = []
    src, wsrc = source(), verify_wg.source(DECODE_SOURCE)
    for s in shapes:
        hq, hk, d, page, sp, bf16, ql = s[:7]
        cfg = s[7] if len(s) > 7 else DEFAULT
        defs = defines(hq, hk, d, page, sp, bf16, ql, cfg)
        wg, per_warp = verify_wg.kernels(cfg, hq, hk, d, ql, sp, 16)
        if wg:
            hs = Layout(d).slot_size_aligned
            jobs.append((wsrc, "verify_wgmma", arch + "a", verify_wg.defines(hq, hk, d, page, hs, ql, cfg.wg, defs)))
        if per_warp:
            jobs.append((src, "verify_k8v4", arch + arch_suffix(defs), defs))
    with ThreadPoolExecutor(max_workers=workers) as ex:
        list(ex.map(lambda j: _cudart.compile_cubin(*j), jobs))
    return len(jobs)
