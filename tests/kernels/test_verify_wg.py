"""The warpgroup-MMA verify kernel's host side (``verify_wg.py``) and its source (``verify_wgmma.cu``) on the CPU:
every shipped shape compiles for sm_90a with NVRTC without spills, the routing rule, the shared-memory budget
and the build's macros. Its GPU tests are in ``test_mtp_verify_gpu.py`` (the warpgroup-MMA section)."""

from __future__ import annotations

import re
import subprocess

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from test_mtp_verify import _cuobjdump, _nvrtc_or_skip  # noqa: E402

from sndr.kernels import _cudart  # noqa: E402
from sndr.kernels.turboquant_k8v4 import mtp_verify as mv  # noqa: E402
from sndr.kernels.turboquant_k8v4 import verify_wg  # noqa: E402

# the warpgroup-MMA kernels (verify_wgmma.cu, sm_90a): (G, K, tiles per stage, stages, f16 stages, blocks per SM,
# registers); f16 stages 0: tq_k8v4_verify_wg, else the warp-specialised tq_k8v4_verify_ws
WG_BUILDS = [(8, 5, 4, 3, 0, 2, None), (8, 7, 4, 3, 0, 2, None), (4, 15, 4, 3, 0, 2, None), (16, 3, 4, 3, 0, 2, None),
             (4, 5, 4, 3, 0, 2, None), (6, 5, 4, 3, 0, 2, None), (8, 3, 2, 4, 0, 3, None), (8, 3, 1, 6, 0, 3, None),
             (8, 5, 2, 6, 0, 3, None),
             (8, 3, 4, 3, 2, 2, None), (8, 5, 4, 3, 2, 2, None), (8, 7, 4, 3, 2, 2, None), (4, 5, 4, 3, 2, 2, None),
             (6, 5, 4, 3, 2, 2, None), (3, 7, 4, 3, 2, 2, None), (4, 15, 4, 3, 2, 2, None), (16, 3, 4, 3, 2, 2, None),
             (8, 7, 2, 4, 4, 2, None), (8, 3, 2, 4, 4, 2, None), (8, 7, 4, 2, 3, 1, (96, 232)),
             # the default's builds below 17 rows (at small batches: verify_wg.SMALL_BATCH), 4 to 16 rows
             (4, 3, 4, 3, 2, 2, None), (8, 1, 4, 3, 2, 2, None), (6, 1, 4, 3, 2, 2, None), (1, 7, 4, 3, 2, 2, None),
             (4, 0, 4, 3, 2, 2, None)]
# round 8's row layout and stage release (WgConfig.spread_rows / early_free off): the probe's baseline builds
ROUND8 = {"spread_rows": False, "early_free": False}
WG_BUILDS_R8 = [(8, 3, 4, 3, 2, 2, None, ROUND8), (4, 5, 4, 3, 2, 2, None, {"spread_rows": False}),
                (4, 7, 4, 3, 2, 2, None, {"early_free": False}), (8, 3, 4, 3, 0, 2, None, ROUND8)]

# verify_tr.cu's transposed kernel (WgConfig.transposed) at 20, 24, 32, 36 and 48 rows (64 rows spill 8 to 24 bytes
# at the 255-register ceiling: not shipped, GPU-tested only)
TR = {"transposed": True}
WG_BUILDS_TR = [(4, 4, 4, 3, 0, 2, None, TR), (4, 5, 4, 3, 0, 2, None, TR), (8, 3, 4, 3, 0, 2, None, TR),
                (6, 5, 4, 3, 0, 2, None, TR), (8, 5, 4, 3, 0, 2, None, TR), (3, 7, 4, 4, 0, 2, None, TR)]


# the probe's diagnostics of round 10: the values unpacked but not stored (16), and that without the P.V (18)
WG_BUILDS_DBG = [(8, 3, 4, 3, 2, 2, None, {"debug": 16}), (8, 5, 4, 3, 2, 2, None, {"debug": 18})]


@pytest.mark.parametrize("g,k,tps,stages,f16,minb,regs,opts",
                         [b + ({},) for b in WG_BUILDS] + WG_BUILDS_R8 + WG_BUILDS_TR + WG_BUILDS_DBG)
def test_kernel_compiles_for_sm90a_without_spills(g, k, tps, stages, f16, minb, regs, opts, tmp_path, monkeypatch):
    """No spills; the warp-specialised kernel starts with 65536 / (256 blocks) registers a thread, the pool its two
    warpgroups' setmaxnreg requests share (fewer would leave the MMA warpgroup's request waiting forever)."""
    _nvrtc_or_skip()
    monkeypatch.setenv("SNDR_CACHE_DIR", str(tmp_path))
    wg = verify_wg.WgConfig(tiles_per_stage=tps, stages=stages, min_blocks=minb, f16_stages=f16,
                            **({"regs": regs} if regs else {}), **opts)
    cfg = mv.VerifyConfig(wgmma=2, wg=wg)
    assert verify_wg.uses(cfg, 8 * g, 8, 128, k + 1, 8 * 196, 16)
    base = mv.defines(8 * g, 8, 128, 16, 8 * 196, True, k + 1, cfg)
    defs = verify_wg.defines(8 * g, 8, 128, 16, 196, k + 1, cfg.wg, base)
    cubin = _cudart.compile_cubin(verify_wg.source(mv.DECODE_SOURCE), "verify_wgmma", "90a", defs)
    assert cubin[:4] == b"\x7fELF"
    assert verify_wg.smem_bytes(wg) + 1024 <= 227 * 1024 and minb * (verify_wg.smem_bytes(wg) + 1024) <= 228 * 1024
    tool = _cuobjdump()
    if tool is None:
        return
    f = tmp_path / "w.cubin"
    f.write_bytes(cubin)
    lines = subprocess.run([tool, "--dump-resource-usage", str(f)], capture_output=True, text=True).stdout.splitlines()
    usage = [lines[i + 1] for i, ln in enumerate(lines[:-1]) if wg.kernel in ln]
    assert len(usage) == 1, lines
    assert "LOCAL:0" in usage[0] and "STACK:0" in usage[0], usage[0]
    if f16:
        reg = int(re.search(r"REG:(\d+)", usage[0]).group(1))
        assert 2 * reg >= sum(wg.regs), (usage[0], wg.regs)


def test_routing_only_where_it_can_run():
    on = mv.VerifyConfig(wgmma=1)
    assert verify_wg.uses(on, 64, 8, 128, 4, 8 * 196, 16)  # 32 rows per KV head
    assert verify_wg.uses(mv.DEFAULT, 64, 8, 128, 4, 8 * 196, 16)  # 32 rows: wgmma by default
    assert verify_wg.uses(mv.DEFAULT, 48, 8, 128, 3, 8 * 196, 16)  # 18 rows: the per-warp kernel's 2 chunks
    assert not verify_wg.uses(mv.DEFAULT, 32, 8, 128, 4, 8 * 196, 16, 8)  # 16 rows, 8 requests: one per-warp chunk
    assert verify_wg.uses(mv.DEFAULT, 64, 8, 128, 6, 8 * 196, 16)  # 48 rows: wgmma by default
    assert verify_wg.uses(mv.DEFAULT, 32, 8, 128, 16, 8 * 196, 16)  # 64 rows (G = 4, K = 15)
    assert not verify_wg.uses(mv.VerifyConfig(wgmma=0), 64, 8, 128, 8, 8 * 196, 16)
    assert not verify_wg.uses(on, 32, 8, 128, 4, 8 * 196, 16)  # 16 rows: the per-warp kernel
    assert not verify_wg.uses(on, 64, 8, 128, 9, 8 * 196, 16)  # 72 rows: more than one m64 tile
    assert not verify_wg.uses(on, 64, 8, 64, 4, 8 * 132, 16)  # head dim 64
    assert not verify_wg.uses(on, 16, 2, 128, 8, 2 * 196, 16)  # 392-byte rows: no tensor map


@pytest.mark.parametrize("g,k", [(4, 3), (8, 1), (2, 7), (6, 1), (4, 2), (3, 4), (1, 7), (4, 1), (1, 0), (8, 0)])
def test_below_17_rows_the_default_runs_it_at_the_small_batches(g, k):
    """verify_wg.SMALL_BATCH: 9..16 rows per KV head at 1 or 2 requests, at most 8 rows at 1 (measured faster than
    the per-warp kernel there at 2K, 8K and 32K contexts); a larger batch, and the configs that name their rows,
    keep the per-warp kernel. kernels(): a shape builds the kernels some batch size runs."""
    rows = g * (k + 1)
    most = 2 if rows > 8 else 1
    args = (8 * g, 8, 128, k + 1, 8 * 196, 16)
    for b in range(1, 5):
        assert verify_wg.uses(mv.DEFAULT, *args, b) == (b <= most), (rows, b)
        assert not verify_wg.uses(mv.VerifyConfig(wgmma=1), *args, b)
        assert not verify_wg.uses(mv.VerifyConfig(wgmma=0), *args, b)
        assert verify_wg.uses(mv.VerifyConfig(wgmma=2), *args, b)
    assert verify_wg.uses(mv.DEFAULT, *args)  # (b None: some batch size runs it)
    assert verify_wg.kernels(mv.DEFAULT, *args) == (True, True)
    assert verify_wg.kernels(mv.VerifyConfig(wgmma=2), *args) == (True, False)
    assert verify_wg.kernels(mv.VerifyConfig(wgmma=0), *args) == (False, True)
    assert verify_wg.kernels(mv.DEFAULT, 64, 8, 128, 4, 8 * 196, 16) == (True, False)  # 32 rows: every batch
    assert not verify_wg.uses(mv.DEFAULT, 8 * g, 8, 64, k + 1, 8 * 132, 16, 1)  # head dim 64: never


def test_smem_budget_is_the_kernels_own():
    """verify_wg.smem_bytes is verify_wgmma.cu's WSMEM for every shape the config can name, and the default fits
    two blocks per SM (228 KB, 1 KB reserved a block)."""
    src = verify_wg.SOURCE_PATH.read_text()
    assert re.search(r"#define WKT 4096", src) and re.search(r"#define WVF 4096", src) and "#define WRT 208" in src
    assert re.search(r"#define WS_STAGE \(2 \* WTPS \* WKT\)", src)
    assert "#define WS_SMEM (WS_B_OFF + 8 * (WSTAGES + 2 * WFST) + 1024)" in src
    for tps in (1, 2, 4):
        for st in (2, 3, 4, 6):
            cfg = verify_wg.WgConfig(tps, st, f16_stages=0)
            keys, vals, ring = tps * 4096, 2 * tps * 4096, st * tps * 16 * 208
            assert verify_wg.smem_bytes(cfg) == keys + vals + ring + 8 * st + 1024
            for n in (2, 3, 4):  # the warp-specialised kernel: n stages of f16 keys and values
                ws = verify_wg.WgConfig(tps, st, f16_stages=n)
                assert verify_wg.smem_bytes(ws) == n * 2 * tps * 4096 + ring + 8 * (st + 2 * n) + 1024
    assert 2 * (verify_wg.smem_bytes(verify_wg.WgConfig(f16_stages=0)) + 1024) <= 228 * 1024
    assert 2 * (verify_wg.smem_bytes(verify_wg.WgConfig()) + 1024) <= 228 * 1024  # (the default)
    tr = verify_wg.SOURCE_TR.read_text()  # the transposed kernel: its TR_SMEM at 64 rows (TR_N), whatever the rows
    assert "#define TR_QT (WSTAGES * WTPS * WRAW)" in tr and "#define TR_PT (TR_QT + 2 * TR_N * 128)" in tr
    assert "#define TR_PTB (4 * TR_N * 32)" in tr and "#define TR_QF (TR_PT + 2 * TR_PTB)" in tr
    assert "#define TR_RED (TR_QF + 256)" in tr and "#define TR_BAR (TR_RED + 1024)" in tr
    assert "#define TR_SMEM (TR_BAR + 8 * WSTAGES + 1024)" in tr
    for st in (2, 3, 4):
        ring = st * 4 * 16 * 208
        cfg = verify_wg.WgConfig(stages=st, transposed=True)
        assert verify_wg.smem_bytes(cfg) == ring + 2 * 64 * 128 + 2 * 4 * 64 * 32 + 256 + 1024 + 8 * st + 1024
    assert 3 * (verify_wg.smem_bytes(verify_wg.WgConfig(transposed=True)) + 1024) <= 228 * 1024


def test_defines_keep_the_base_and_name_the_shape():
    base = mv.defines(64, 8, 128, 16, 8 * 196, True, 6)
    defs = verify_wg.defines(64, 8, 128, 16, 196, 6, verify_wg.WgConfig(2, 4, 3, v_desc=(256, 128), debug=4), base)
    assert defs["QBF16"] == 1 and defs["SP"] == 8 * 196  # decode_k8v4.cu's macros, from the per-warp build
    assert (defs["QL"], defs["GQ"], defs["HK"], defs["HS"], defs["PAGE"]) == (6, 8, 8, 196, 16)
    assert (defs["WTPS"], defs["WSTAGES"], defs["WMINB"]) == (2, 4, 3)
    assert (defs["WV_DESC_LBO"], defs["WV_DESC_SBO"], defs["WG_DBG"]) == (256, 128, 4)
    plain = verify_wg.defines(64, 8, 128, 16, 196, 6, verify_wg.WgConfig(f16_stages=0), base)
    assert "WV_DESC_LBO" not in plain and "WG_DBG" not in plain  # (the kernel's own defaults)
    assert "WFST" not in plain and verify_wg.WgConfig(f16_stages=0).kernel == "tq_k8v4_verify_wg"
    default = verify_wg.defines(64, 8, 128, 16, 196, 6, verify_wg.WgConfig(), base)
    assert (default["WFST"], default["WREG_DQ"], default["WREG_MMA"]) == (2, 80, 176)
    ws = verify_wg.WgConfig(f16_stages=3, regs=(96, 232), min_blocks=1)
    defs = verify_wg.defines(64, 8, 128, 16, 196, 6, ws, base)
    assert (defs["WFST"], defs["WREG_DQ"], defs["WREG_MMA"], defs["WMINB"]) == (3, 96, 232, 1)
    assert (ws.kernel, ws.threads, verify_wg.WgConfig(f16_stages=0).threads) == ("tq_k8v4_verify_ws", 256, 128)
    src = verify_wg.SOURCE_PATH.read_text()  # the kernels' names and block sizes
    assert "__launch_bounds__(128, WMINB) tq_k8v4_verify_wg(" in src
    assert "__launch_bounds__(256, WMINB) tq_k8v4_verify_ws(" in src
    assert re.search(r"#define WREG_DQ 80 ", src) and re.search(r"#define WREG_MMA 176 ", src)
    assert verify_wg.WgConfig().regs == (80, 176)  # (the source's defaults, for a build without the macros)
    # the row layout and the stage release: on in the source, named only where a config turns them off
    assert re.search(r"#define WSPREAD 1 ", src) and re.search(r"#define WEARLY 1 ", src)
    assert "WSPREAD" not in default and "WEARLY" not in default
    r8 = verify_wg.defines(64, 8, 128, 16, 196, 6, verify_wg.WgConfig(spread_rows=False, early_free=False), base)
    assert (r8["WSPREAD"], r8["WEARLY"]) == (0, 0)
    # the transposed kernel: its own macros (the query rows rounded up to 8), none of the specialised kernel's
    tr = verify_wg.WgConfig(transposed=True)
    for hq, ql, n in ((64, 6, 48), (48, 6, 40), (32, 5, 24), (24, 7, 24), (64, 8, 64)):
        defs = verify_wg.defines(hq, 8, 128, 16, 196, ql, tr, base)
        assert (defs["WTR"], defs["TR_N"], defs["WTPS"], defs["QL"], defs["GQ"]) == (1, n, 4, ql, hq // 8)
        assert not {"WFST", "WREG_DQ", "WSPREAD", "WEARLY", "TR_DBG"} & set(defs)
    assert (tr.kernel, tr.threads) == ("tq_k8v4_verify_tr", 128)
    with pytest.raises(ValueError, match="a stage is 4 tiles"):
        verify_wg.WgConfig(tiles_per_stage=2, transposed=True)
    assert verify_wg.defines(64, 8, 128, 16, 196, 6, verify_wg.WgConfig(transposed=True, debug=2), base)["TR_DBG"] == 2
    assert "__launch_bounds__(128, WMINB) tq_k8v4_verify_tr(" in verify_wg.SOURCE_TR.read_text()


def test_mma_wrappers_spell_every_operand_once():
    """wg_mma, generated for N = 8..64 (the transposed kernel's query rows) and 128 (the P.V over 128 dims): N / 2
    accumulators, four A registers, the descriptor, the scale-d flag and the transpose immediate, numbered in
    order; the source has no wgmma of its own besides these, and both kernel files call them."""
    text = verify_wg.mma_wrappers()
    blocks = text.split("template <int TB>\n")[1:]
    assert verify_wg.MMA_NS == (8, 16, 24, 32, 40, 48, 56, 64, 128) and len(blocks) == 9
    for n, blk in zip(verify_wg.MMA_NS, blocks):
        h = n // 2
        assert f"wg_mma(float (&d)[{h}]" in blk and f"m64n{n}k16.f32.f16.f16" in blk
        assert f"setp.ne.b32 p, %{h + 5}, 0" in blk and f"p, 1, 1, %{h + 6};" in blk
        used = sorted({int(x) for x in re.findall(r"%(\d+)", blk)})
        assert used == list(range(h + 7))
        assert blk.count('"+f"(d[') == h and blk.count('"r"(a[') == 4
    for path in (verify_wg.SOURCE_PATH, verify_wg.SOURCE_TR):
        src = path.read_text()
        assert "wgmma.mma_async" not in src and "wg_mma<" in src, path.name
    full = verify_wg.source(mv.DECODE_SOURCE)
    assert full.index("wg_mma(float (&d)[64]") < full.index('#line 1 "verify_wgmma.cu"') < full.index("verify_tr.cu")


def test_maps_for_routes_and_a_refused_map_disables_the_kernel_on_that_device(monkeypatch, caplog):
    """maps_for: None where the shape is the per-warp kernel's (16 rows by default, head dim 64, 392-byte rows);
    the map where it runs; a map the driver refuses turns the kernel off on that device only, said once."""
    monkeypatch.setattr(verify_wg, "BROKEN", {})
    made = []

    def fake_maps(kv):
        made.append(kv.shape)
        return torch.zeros(128, dtype=torch.uint8)

    monkeypatch.setattr(verify_wg, "tensor_maps", fake_maps)
    cache = torch.zeros(4, 16, 8, 196, dtype=torch.uint8)
    assert verify_wg.maps_for(mv.DEFAULT, 0, 32, 128, 4, cache, 8) is None  # 16 rows, 8 requests: the per-warp kernel
    assert verify_wg.maps_for(mv.DEFAULT, 0, 64, 64, 6, cache, 8) is None  # head dim 64
    small = torch.zeros(4, 16, 2, 196, dtype=torch.uint8)  # 392-byte rows: no tensor map
    assert verify_wg.maps_for(mv.VerifyConfig(wgmma=1), 0, 16, 128, 8, small, 8) is None
    assert not made
    assert verify_wg.maps_for(mv.DEFAULT, 0, 64, 128, 6, cache, 8) is not None  # 48 rows
    assert verify_wg.maps_for(mv.DEFAULT, 0, 32, 128, 4, cache, 2) is not None  # 16 rows, 2 requests
    assert made == [cache.shape] * 2

    def refused(kv):
        raise _cudart.CudaError("cuTensorMapEncodeTiled(...): invalid argument (1)")

    monkeypatch.setattr(verify_wg, "tensor_maps", refused)
    with caplog.at_level("WARNING", logger="sndr.kernels"):
        assert verify_wg.maps_for(mv.DEFAULT, 1, 64, 128, 6, cache, 8) is None
        assert verify_wg.maps_for(mv.DEFAULT, 1, 64, 128, 8, cache, 8) is None
    assert list(verify_wg.BROKEN) == [1] and "invalid argument" in verify_wg.BROKEN[1]
    assert sum("wgmma verify kernel disabled on cuda:1" in r.getMessage() for r in caplog.records) == 1
    monkeypatch.setattr(verify_wg, "tensor_maps", fake_maps)
    assert verify_wg.maps_for(mv.DEFAULT, 0, 64, 128, 6, cache, 8) is not None  # device 0 unaffected


def test_maps_for_in_a_capture_before_any_eager_call_runs_the_per_warp_kernel_and_says_so(monkeypatch, caplog):
    monkeypatch.setattr(verify_wg, "BROKEN", {})
    monkeypatch.setattr(verify_wg, "_SAID", set())
    monkeypatch.setattr(verify_wg, "tensor_maps", lambda kv: None)  # (what it returns inside such a capture)
    cache = torch.zeros(4, 16, 8, 196, dtype=torch.uint8)
    with caplog.at_level("INFO", logger="sndr.kernels"):
        assert verify_wg.maps_for(mv.DEFAULT, 0, 64, 128, 6, cache, 8) is None
        assert verify_wg.maps_for(mv.DEFAULT, 0, 64, 128, 8, cache, 8) is None
    assert sum("no eager call had seen" in r.getMessage() for r in caplog.records) == 1
    assert not verify_wg.BROKEN  # (not a failure: the next eager call makes the map)


def test_tensor_map_needs_a_cuda_12_driver_and_whole_shapes(monkeypatch):
    """_cudart.tensor_map_tiled: a driver without cuTensorMapEncodeTiled is a CudaError that names it (maps_for then
    turns the kernel off on that device); dims, strides and box sizes that do not fit are refused before the driver."""
    monkeypatch.setattr(_cudart, "_driver", lambda: object())
    with pytest.raises(_cudart.CudaError, match="cuTensorMapEncodeTiled: not in this driver"):
        _cudart.tensor_map_tiled(0, (1568, 16, 4), (1568, 25088), (208, 16, 1))

    class Driver:
        cuTensorMapEncodeTiled = staticmethod(lambda *a: 0)

    monkeypatch.setattr(_cudart, "_driver", lambda: Driver())
    with pytest.raises(ValueError, match="3 dims, 1 strides"):
        _cudart.tensor_map_tiled(0, (1568, 16, 4), (1568,), (208, 16, 1))

