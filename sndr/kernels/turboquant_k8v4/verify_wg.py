"""The warpgroup-MMA verify kernels (``verify_wgmma.cu``, sm_90a): a block per (request, split, KV head) streams
the head's tiles with TMA tensor copies, converts each tile's keys and values once into f16 wgmma operands, and
scores all ``QL * G <= 64`` query rows of the KV head in one m64 tile; by default (``WgConfig.f16_stages``) one
warpgroup converts while another runs the MMAs and the softmax. ``WgConfig.transposed`` builds ``verify_tr.cu``'s
kernel instead (the cache unpacked into the MMA registers; opt-in, measured slower). The splits are merged by
``decode_k8v4.cu``'s merges, as for ``verify_k8v4.cu`` (:mod:`.mtp_verify` routes and launches both).
"""

from __future__ import annotations

import ctypes as C
import logging
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from .. import _cudart

SOURCE_PATH = Path(__file__).with_name("verify_wgmma.cu")
SOURCE_TR = Path(__file__).with_name("verify_tr.cu")
KERNEL = "tq_k8v4_verify_wg"  # one warpgroup converts and multiplies (WgConfig.f16_stages = 0)
KERNEL_WS = "tq_k8v4_verify_ws"  # a converting warpgroup feeds an MMA warpgroup (f16_stages >= 2: the default)
KERNEL_TR = "tq_k8v4_verify_tr"  # one warpgroup, keys and values unpacked into registers (WgConfig.transposed)
_SOURCE: list[str] = []
BROKEN: dict[int, str] = {}  # device index -> why this kernel is off there (disable)
_SAID: set[int] = set()  # devices where a capture met an unseen cache (maps_for)
LOG = logging.getLogger("sndr.kernels")
_MAPS: dict[tuple, torch.Tensor] = {}


@dataclass(frozen=True)
class WgConfig:
    # 16-token tiles per ring stage (1, 2 or 4: N of the score wgmma is 16 x this), ring depth (copied tiles),
    # blocks per SM asked of the register allocator
    tiles_per_stage: int = 4
    stages: int = 3
    min_blocks: int = 2
    v_desc: tuple[int, int] = (0, 0)  # (LBO, SBO) of the value descriptor; (0, 0): the layout's own steps
    debug: int = 0  # verify_wgmma.cu's WG_DBG (diagnostics only: wrong outputs)
    # 2+: tq_k8v4_verify_ws, a warpgroup converting into a ring of this many f16 stages for an MMA warpgroup, with
    # these registers each (setmaxnreg; together <= 512 / min_blocks); 0: tq_k8v4_verify_wg (one warpgroup does
    # both). 4 x 3, 2 f16 stages, 2 blocks per SM measured fastest of that, 2 x 4 with 4 f16 stages, 1 block per SM
    # with 3, and the one-warpgroup kernel's shapes, on the H200 (docs/bench-mtp-verify-h200.md, round 8)
    f16_stages: int = 2
    regs: tuple[int, int] = (80, 176)
    # at most 32 query rows: 8 a warp, so all four warps run the softmax (verify_wgmma.cu's WSPREAD); the specialised
    # kernel frees an f16 stage as soon as its P.V is done (WEARLY). Both measured faster (round 9); False: round 8
    spread_rows: bool = True
    early_free: bool = True
    # verify_tr.cu's kernel (tiles_per_stage 4; f16_stages, regs, spread_rows, early_free, v_desc and debug do not
    # apply): S^T = K Q^T and O^T = V^T P^T, the cache the register operand, the query rows N
    transposed: bool = False

    def __post_init__(self) -> None:
        if self.transposed and self.tiles_per_stage != 4:
            raise ValueError("WgConfig(transposed=True): a stage is 4 tiles (the 64 tokens of S^T's M), "
                             f"not {self.tiles_per_stage}")

    @property
    def threads(self) -> int:
        return 256 if self.f16_stages and not self.transposed else 128

    @property
    def kernel(self) -> str:
        return KERNEL_TR if self.transposed else KERNEL_WS if self.f16_stages else KERNEL


MMA_NS = (*range(8, 65, 8), 128)  # the N of every wgmma a kernel here issues: the query rows rounded to 8, 128 dims


def mma_wrappers() -> str:
    """``wg_mma<TB>(d, a, desc, acc)``, one overload per N of :data:`MMA_NS`: ``wgmma m64nNk16`` (fp32 d [+]= f16 A
    in registers . B by descriptor, ``TB`` its transpose bit, ``acc`` = 0: the product alone). An asm operand list
    is spelt out per N, so it is generated here once rather than written out per kernel and N."""
    out = []
    for n in MMA_NS:
        h = n // 2
        regs = ", ".join(f"%{i}" for i in range(h))
        outs = ",\n                   ".join(", ".join(f'"+f"(d[{i}])' for i in range(j, min(j + 8, h)))
                                             for j in range(0, h, 8))
        out.append(
            "template <int TB>\n"
            f"static __device__ __forceinline__ void wg_mma(float (&d)[{h}], const u32 (&a)[4], u64 desc, int acc)\n"
            "{\n"
            f'    asm volatile("{{\\n .reg .pred p;\\n setp.ne.b32 p, %{h + 5}, 0;\\n"\n'
            f'                 "wgmma.mma_async.sync.aligned.m64n{n}k16.f32.f16.f16 {{{regs}}}, '
            f'{{%{h}, %{h + 1}, %{h + 2}, %{h + 3}}}, %{h + 4}, p, 1, 1, %{h + 6};\\n}}\\n"\n'
            f"                 : {outs}\n"
            '                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(acc), "n"(TB));\n'
            "}\n")
    return "".join(out)


def source(decode_source: Path) -> str:
    """decode_k8v4.cu (``decode_source``), the wgmma wrappers (:func:`mma_wrappers`), verify_wgmma.cu and
    verify_tr.cu, read once per process (a #line names each part)."""
    if not _SOURCE:
        _SOURCE.append(decode_source.read_text() + '\n#line 1 "verify_wg.py:mma_wrappers"\n' + mma_wrappers()
                       + '\n#line 1 "verify_wgmma.cu"\n' + SOURCE_PATH.read_text()
                       + '\n#line 1 "verify_tr.cu"\n' + SOURCE_TR.read_text())
    return _SOURCE[0]


# VerifyConfig.wgmma = -1: at every batch from this many query rows per KV head, where the per-warp kernel needs two
# 16-row chunks (the warp-specialised kernel measured faster than it from 24 rows, its fewest in the table: round 8)
MIN_ROWS = 17
# and below it at batches of at most this many requests, by the rows per KV head: (rows at most, requests at most).
# There the per-warp kernel's grid is small and the specialised kernel measured faster at every context; at larger
# batches it loses at long contexts, which a CUDA graph captured for a batch size must also serve (the choice can
# depend on the batch, not on the lengths): docs/bench-mtp-verify-h200.md, round 11
SMALL_BATCH = ((8, 1), (16, 2))


def uses(cfg, hq: int, hk: int, d: int, ql: int, sp: int, kv_sblk: int, b: int | None = None) -> bool:
    """Whether a call of this shape and ``b`` requests runs this kernel under ``cfg`` (an
    ``mtp_verify.VerifyConfig``: its ``wgmma``); ``b`` None: whether a call of some batch size does (the kernel to
    build ahead). Head dim 128, at most 64 query rows per KV head, 16-byte strided rows and blocks (the tensor map's
    strides), and the rows (``wgmma``): -1 from MIN_ROWS, below it at the batches of SMALL_BATCH; 1 from 17; 2 all."""
    rows = ql * (hq // hk)
    if not (cfg.wgmma and d == 128 and rows <= 64 and sp % 16 == 0 and kv_sblk % 16 == 0):
        return False
    if cfg.wgmma == 2:
        return True
    if rows >= (MIN_ROWS if cfg.wgmma < 0 else 17):
        return True
    most = next((n for r, n in SMALL_BATCH if rows <= r), 0)  # (the first bracket that holds the rows)
    return cfg.wgmma < 0 and most > 0 and (b is None or b <= most)


def kernels(cfg, hq: int, hk: int, d: int, ql: int, sp: int, kv_sblk: int) -> tuple[bool, bool]:
    """(this kernel, the per-warp kernel): whether calls of this shape run each at some batch size (:func:`uses`)."""
    return uses(cfg, hq, hk, d, ql, sp, kv_sblk), not uses(cfg, hq, hk, d, ql, sp, kv_sblk, sys.maxsize)


def maps_for(cfg, idx: int, hq: int, d: int, ql: int, kv_cache: torch.Tensor, b: int) -> torch.Tensor | None:
    """The cache's tensor map where a call of this shape and ``b`` requests runs this kernel on device ``idx``
    (:func:`uses`, the kernel not disabled there, the map made: :func:`tensor_maps`), else None (the per-warp kernel
    runs). A map the driver refuses disables the kernel on the device (:func:`disable`)."""
    if idx in BROKEN or not uses(cfg, hq, kv_cache.shape[2], d, ql, kv_cache.stride(1), kv_cache.stride(0), b):
        return None
    try:
        m = tensor_maps(kv_cache)
    except (_cudart.CudaUnavailable, _cudart.CudaError) as exc:
        disable(idx, str(exc).splitlines()[0])
        return None
    if m is None and idx not in _SAID:  # (vLLM's eager warm-up before its captures makes the maps first)
        _SAID.add(idx)
        LOG.info("sndr: a CUDA-graph capture met a TurboQuant cache no eager call had seen: this capture runs the "
                 "per-warp verify kernel (cuda:%d)", idx)
    return m


def disable(idx: int, why: str) -> None:
    """This kernel off on device ``idx`` for the process (a build, load or tensor-map failure), said once; the
    per-warp kernel takes its calls."""
    if idx not in BROKEN:
        BROKEN[idx] = why
        LOG.warning("sndr: TurboQuant wgmma verify kernel disabled on cuda:%d, using the per-warp kernel: %s", idx, why)


def load(decode_source: Path, idx: int, hq: int, hk: int, d: int, page: int, hs: int, ql: int, cfg: WgConfig,
         base: dict) -> _cudart.Kernel:
    """The kernel of a shape, compiled (sm_90a) and loaded on device ``idx``; its module holds the merges."""
    return _cudart.load_kernel(source(decode_source), cfg.kernel, defines(hq, hk, d, page, hs, ql, cfg, base),
                               idx, smem_bytes(cfg), label="verify_wgmma", arch_suffix="a")


def defines(hq: int, hk: int, d: int, page: int, hs: int, ql: int, cfg: WgConfig, base: dict) -> dict:
    """The decode_k8v4.cu macros of a verify build (``base``) plus this kernel's."""
    shape = {"QL": ql, "GQ": hq // hk, "HK": hk, "HS": hs, "D": d, "PAGE": page, "WTPS": cfg.tiles_per_stage,
             "WSTAGES": cfg.stages, "WMINB": cfg.min_blocks}
    if cfg.transposed:  # (verify_tr.cu: the query rows rounded up to 8 are its N)
        return dict(base) | {"WTR": 1, "TR_N": -(-ql * (hq // hk) // 8) * 8} \
            | ({"TR_DBG": cfg.debug} if cfg.debug else {}) | shape
    lbo, sbo = cfg.v_desc
    extra = ({"WV_DESC_LBO": lbo, "WV_DESC_SBO": sbo} if lbo else {}) | ({"WG_DBG": cfg.debug} if cfg.debug else {}) \
        | ({} if cfg.spread_rows else {"WSPREAD": 0}) | ({} if cfg.early_free else {"WEARLY": 0})
    if cfg.f16_stages:
        extra |= {"WFST": cfg.f16_stages, "WREG_DQ": cfg.regs[0], "WREG_MMA": cfg.regs[1]}
    return dict(base) | extra | shape


def smem_bytes(cfg: WgConfig) -> int:
    """verify_wgmma.cu's WSMEM: one stage's f16 keys, two stages' f16 values, the ring of copied tiles (16 rows of
    208 bytes), its barriers, and the slack that aligns the base to 1024 bytes; or its WS_SMEM
    (``cfg.f16_stages``): that many stages of f16 keys and values, the ring, the barriers and the slack."""
    t, n = cfg.tiles_per_stage, cfg.f16_stages
    ring = cfg.stages * t * 16 * 208
    if cfg.transposed:  # verify_tr.cu's TR_SMEM at 64 rows: the ring, Q^T, two P^T, the row factors, the column sums
        return cfg.stages * 4 * 16 * 208 + 64 * 256 + 2 * 64 * 128 + 256 + 1024 + 8 * cfg.stages + 1024
    if n:
        return n * 2 * t * 4096 + ring + 8 * (cfg.stages + 2 * n) + 1024
    return t * 4096 + 2 * t * 4096 + ring + 8 * cfg.stages + 1024


def tensor_maps(kv_cache: torch.Tensor) -> torch.Tensor | None:
    """The cache's tensor map ([row bytes, page tokens, blocks], a box of 208 bytes x 16 tokens: a box starts
    16-byte aligned, so a head's 196-byte slot is read from its start rounded down to 16) as 128 bytes in device
    memory, made once per cache tensor by an eager call (None inside a CUDA-graph capture that has not seen this
    cache: the caller then runs the per-warp kernel)."""
    nb, page, hk, slot = kv_cache.shape
    st = kv_cache.stride()
    key = (kv_cache.data_ptr(), nb, page, st[0], st[1], kv_cache.device.index)
    m = _MAPS.get(key)
    if m is None:
        if torch.cuda.is_current_stream_capturing():
            return None
        tm = _cudart.tensor_map_tiled(kv_cache.data_ptr(), (st[1], page, nb), (st[1], st[0]), (208, 16, 1))
        host = torch.frombuffer(bytearray(tm), dtype=torch.uint8)
        # kept for the process (128 bytes a cache tensor): a captured graph holds the map's address, so it is
        # never freed; the same address and shape later make the same map
        m = _MAPS[key] = host.to(kv_cache.device)  # (torch's allocations are 512-byte aligned)
    return m


def launch_args(maps: torch.Tensor, query: torch.Tensor, block_table: torch.Tensor, seq_lens: torch.Tensor,
                mid_o: torch.Tensor, mid_l: torch.Tensor, qk_scale: float, splits: int, min_tiles: int) -> list:
    return [C.c_void_p(maps.data_ptr()), C.c_void_p(query.data_ptr()), C.c_void_p(block_table.data_ptr()),
            C.c_void_p(seq_lens.data_ptr()), C.c_void_p(mid_o.data_ptr()), C.c_void_p(mid_l.data_ptr()),
            C.c_float(qk_scale), C.c_int(splits), C.c_int(min_tiles), C.c_longlong(query.stride(0)),
            C.c_longlong(query.stride(1)), C.c_longlong(block_table.stride(0))]

