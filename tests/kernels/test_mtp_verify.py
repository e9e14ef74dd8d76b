"""The TurboQuant k8v4 spec-verify decode (``mtp_verify``), on a machine without a GPU.

* ``verify_k8v4.cu`` (with ``decode_k8v4.cu``, as ``mtp_verify`` builds it)
  compiles with NVRTC for sm_90 for K in {0, 1, 3, 5, 7} x G in {1, 4, 6, 8}
  and other head dims, group sizes, pages and dtypes, and for every block
  plan (one warp per KV head; the shared-tile CTA with all or a group of the
  KV heads), with no local-memory spills. The kernel uses TMA bulk copies: sm_89 is not a target; there the
  call runs PK0001's decode on synthetic rows (checked below).
* The kernel's algorithm (split boundaries, per-row causal limits, empty
  rows, merge) emulated in float64 against the reference of K + 1 separate
  decode calls; ragged contexts, pages ending mid-block, contexts <= K.
* The fallback (B (K + 1) synthetic rows through PK0001's decode, here the
  Triton kernel under the interpreter) against the same reference.
* Launch planning and the call checks. Numerical tests of the CUDA kernel
  itself: ``test_mtp_verify_gpu.py``.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from sndr.kernels import _cudart  # noqa: E402
from sndr.kernels.turboquant_k8v4 import mtp_verify as mv
from sndr.kernels.turboquant_k8v4 import reference, verify_wg  # noqa: E402
from sndr.kernels.turboquant_k8v4._layout import Layout  # noqa: E402


def _nvrtc_or_skip():
    try:
        return _cudart.nvrtc_version()
    except _cudart.CudaUnavailable as exc:
        pytest.skip(f"no NVRTC on this machine: {exc}")


def _cuobjdump() -> str | None:
    try:
        import triton

        p = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
        if p.is_file():
            return str(p)
    except ImportError:
        pass
    return shutil.which("cuobjdump")


def _usage(cubin: bytes, tmp_path: Path) -> list[str]:
    tool = _cuobjdump()
    if tool is None:
        return []
    f = tmp_path / "v.cubin"
    f.write_bytes(cubin)
    out = subprocess.run([tool, "--dump-resource-usage", str(f)], capture_output=True, text=True).stdout
    lines = out.splitlines()
    return [lines[i + 1] for i, ln in enumerate(lines[:-1]) if "tq_k8v4_verify_page" in ln or "tq_k8v4_merge" in ln]


# (head dim, Hk, G, K, page, bf16)
GRID = [(128, 8, g, k, 16, True) for k in (0, 1, 3, 5, 7) for g in (1, 4, 6, 8)]
OTHER = [(64, 4, 8, 3, 16, False), (256, 8, 4, 3, 16, True), (256, 4, 8, 1, 32, True), (128, 16, 2, 3, 64, True),
         (128, 2, 16, 3, 16, False), (128, 1, 4, 15, 16, True), (128, 8, 8, 5, 16, True)]


# the block plans the GPU tests and the benchmark's probe compare (G (K + 1) > 16 rows per KV head)
T16 = mv.VerifyConfig(rows_per_warp=16)  # the shared-tile CTA of 16-row warps (the default at 48 rows)
PLAN_CFGS = [mv.VerifyConfig(chunk_warps=1), mv.VerifyConfig(rows_per_warp=16, heads_per_block=4),
             mv.VerifyConfig(rows_per_warp=16, chunk_warps=2), mv.VerifyConfig(rows_per_warp=16, heads_per_block=2,
                                                                                stages=4),
             mv.VerifyConfig(rows_per_warp=16, kchain=2), T16,
             # wide warps (32 rows a warp, the default at 17..32 and 64 rows), all heads or 4 a block
             mv.VerifyConfig(rows_per_warp=32), mv.VerifyConfig(rows_per_warp=32, heads_per_block=8),
             # the shared-unpack CTA (unpack=1, measured slower, not the default): its own plan and all 8 heads
             # with one unpacked tile. (Its 4-stage and two-chunk-warps-two-tiles variants, which the GPU tests
             # run, spill 8 bytes at 128 registers under NVRTC 13.5: not listed here.)
             mv.VerifyConfig(unpack=1), mv.VerifyConfig(unpack=1, heads_per_block=8, unpack_buffers=1),
             # the cheaper per-score softmax paths (softmax_tile_mma; 2: with ex2.approx.f16x2)
             mv.VerifyConfig(softmax=1), mv.VerifyConfig(softmax=2),
             # the warp-specialised pair (sm_90a: setmaxnreg), 4 and 8 KV heads a block
             mv.VerifyConfig(ws=1), mv.VerifyConfig(ws=1, heads_per_block=8)]
PLANNED = [(128, 8, g, k, 16, True, i) for g, k in ((8, 3), (4, 5), (8, 7)) for i in range(len(PLAN_CFGS))]
PLANNED += [(128, 8, 8, 5, 16, True, PLAN_CFGS.index(mv.VerifyConfig(rows_per_warp=32)))]
PLANNED += [(128, 8, g, k, 16, True, PLAN_CFGS.index(mv.VerifyConfig(ws=1))) for g, k in ((4, 7), (6, 3))]


@pytest.mark.parametrize("d,hk,g,k,page,bf16,cfg", [s + (-1,) for s in GRID + OTHER] + PLANNED)
def test_verify_source_compiles_for_sm90_without_spills(d, hk, g, k, page, bf16, cfg, tmp_path, monkeypatch):
    _nvrtc_or_skip()
    monkeypatch.setenv("SNDR_CACHE_DIR", str(tmp_path))
    sp = hk * Layout(d).slot_size_aligned
    defs = mv.defines(hk * g, hk, d, page, sp, bf16, k + 1, mv.DEFAULT if cfg < 0 else PLAN_CFGS[cfg])
    cubin = _cudart.compile_cubin(mv.source(), mv.KERNEL, "90" + mv.arch_suffix(defs), defs)
    assert cubin[:4] == b"\x7fELF"
    usage = _usage(cubin, tmp_path)
    if _cuobjdump() is None:
        return
    assert len(usage) == 3, usage  # the verify kernel and the two merges it may launch
    for line in usage:
        assert "LOCAL:0" in line and "STACK:0" in line, f"G={g} K={k} D={d}: {line.strip()}"


def test_compile_error_names_verify_file(tmp_path, monkeypatch):
    _nvrtc_or_skip()
    monkeypatch.setenv("SNDR_CACHE_DIR", str(tmp_path))
    defs = mv.defines(32, 8, 128, 16, 8 * 196, True, 4)
    defs["NCH"] = 3  # breaks the row-chunk static_assert
    with pytest.raises(_cudart.CudaError, match=r"verify_k8v4\.cu\(\d+\): error"):
        _cudart.compile_cubin(mv.source(), mv.KERNEL, "90", defs, cache=False)


@pytest.mark.parametrize("ql,g,rc,nch", [(1, 8, 8, 1), (4, 4, 16, 1), (4, 8, 16, 2), (6, 4, 16, 2), (8, 8, 16, 4),
                                         (2, 1, 2, 1), (8, 6, 16, 3), (16, 16, 16, 16)])
def test_row_chunks(ql, g, rc, nch):
    assert mv.row_chunks(ql, g) == (rc, nch)


def test_defines_and_register_budget():
    d = mv.defines(32, 8, 128, 16, 8 * 196, True, 4)
    assert (d["G"], d["GQ"], d["QL"], d["RC"], d["NCH"], d["PAGE_CTA"]) == (16, 4, 4, 16, 1, 1)
    assert d["MINB"] == 2 and d["QSMEM"] == 1  # 16 rows: Q fragments in shared memory, two blocks per SM
    regs = mv.defines(32, 8, 128, 16, 8 * 196, True, 4, mv.VerifyConfig(qsmem=0))
    assert (regs["MINB"], regs["QSMEM"]) == (1, 0)  # in registers: twice the accumulators, half the blocks
    assert mv.defines(8, 8, 128, 16, 8 * 196, True, 1)["MINB"] == 2
    assert mv.defines(8, 8, 128, 16, 8 * 196, True, 1)["QSMEM"] == 0
    assert mv.smem_bytes(mv.DEFAULT, 8 * 196, 8, 16, 128) == 3 * 16 * 1584 + 48 + 8 * 2 * 8 * 2 * 32 * 4
    assert (d["ROWP"], d["ROWCOPY"]) == (1584, 1)
    assert d["KCHAIN"] == 1 and mv.defines(32, 8, 128, 16, 8 * 196, True, 4, mv.VerifyConfig(kchain=2))["KCHAIN"] == 2
    smx = mv.VerifyConfig(softmax=1)
    assert mv.defines(32, 8, 128, 16, 8 * 196, True, 4, smx)["SMX"] == 1
    assert mv.defines(64, 8, 128, 16, 8 * 196, True, 4, mv.VerifyConfig(softmax=2, unpack=1))["SMX"] == 0  # SHU


def test_block_plan_per_shape():
    # <= 16 rows per KV head: today's kernel, one warp per head, one block per (request, split)
    for g, k in ((1, 7), (4, 3), (8, 1), (16, 0)):
        p = mv.block_plan(8 * g, 8, 128, k + 1, 8 * 196, 196)
        assert (p.hpb, p.ncw, p.nchb, p.blocks(8)) == (8, 1, 1, 1)
    # more rows, 16-row warps: every chunk of a KV head on one copied tile; 16 warps at most, so 3-4 chunks
    # take 4 heads a block (their 4 x 196 = 784 bytes of each token row: 16-byte aligned pieces)
    for g, k, hpb, ncw in ((8, 3, 8, 2), (4, 5, 8, 2), (4, 7, 8, 2), (6, 3, 8, 2), (8, 5, 4, 3), (6, 7, 4, 3),
                           (8, 7, 4, 4)):
        p = mv.block_plan(8 * g, 8, 128, k + 1, 8 * 196, 196, T16)
        assert (p.rc, p.hpb, p.ncw, p.nchb, p.warps, p.shu) == (16, hpb, ncw, 1, hpb * ncw, False), (g, k)
        assert p.blocks(8) == 8 // hpb
        d = mv.defines(8 * g, 8, 128, 16, 8 * 196, True, k + 1, T16)
        assert (d["HPB"], d["NCW"], d["NCHB"], d["MINB"], d["SHU"]) == (hpb, ncw, 1, 1, 0)
        assert d["CB"] == (8 * 196 if hpb == 8 else hpb * 196) and d["HS"] == (0 if hpb == 8 else 196)
    # the default: wide warps at 17..32 rows (one warp per KV head, 4 heads a block) and 64 (two 32-row warps
    # on one tile, 4 heads: 8 warps); 16-row warps at 48 (a wide second warp would be half empty)
    for g, k, rc, hpb, ncw in ((8, 3, 32, 4, 1), (4, 5, 24, 4, 1), (4, 7, 32, 4, 1), (6, 3, 24, 4, 1),
                               (8, 7, 32, 4, 2), (8, 5, 16, 4, 3), (6, 7, 16, 4, 3), (16, 3, 32, 4, 2)):
        p = mv.block_plan(8 * g, 8, 128, k + 1, 8 * 196, 196)
        assert (p.rc, p.hpb, p.ncw, p.nchb, p.shu) == (rc, hpb, ncw, 1, False), (g, k)
        d = mv.defines(8 * g, 8, 128, 16, 8 * 196, True, k + 1)
        assert (d["RC"], d["G"], d["MINB"], d["QSMEM"]) == (rc, rc, 1, 1), (g, k)
    # the builds the benchmark timed as (aw) are the default's wherever the default takes wide warps, but for
    # the softmax path: softmax_tile_mma (SMX 1) in the default at > 16 rows, softmax_tile in (aw) and at <= 16
    wide = mv.VerifyConfig(rows_per_warp=32, heads_per_block=4, softmax=0)
    for g, k in ((4, 5), (4, 7), (8, 3), (8, 7)):
        d = mv.defines(8 * g, 8, 128, 16, 8 * 196, True, k + 1)
        assert d == {**mv.defines(8 * g, 8, 128, 16, 8 * 196, True, k + 1, wide), "SMX": 1}
    for g, k in ((8, 5), (6, 3)):
        assert mv.defines(8 * g, 8, 128, 16, 8 * 196, True, k + 1)["SMX"] == 1
    for g, k in ((4, 3), (8, 1), (1, 7), (16, 0)):
        assert mv.defines(8 * g, 8, 128, 16, 8 * 196, True, k + 1)["SMX"] == 0
    assert mv.defines(64, 8, 256, 16, 8 * 516, True, 4)["SMX"] == 0 and mv.defines(64, 4, 64, 16, 4 * 100, False, 4)[
        "SMX"] == 0
    # unpack=1, the shared-unpack CTA: 4 heads a block; 2 chunk warps (8 warps, two blocks per SM) with one
    # unpacked tile (two would cost the second block), 3-4 chunk warps (one block per SM) with two
    shu = mv.VerifyConfig(unpack=1)
    for g, k, ncw, ubuf, minb in ((8, 3, 2, 1, 2), (4, 5, 2, 1, 2), (4, 7, 2, 1, 2), (6, 3, 2, 1, 2), (8, 5, 3, 2, 1),
                                  (6, 7, 3, 2, 1), (8, 7, 4, 2, 1)):
        p = mv.block_plan(8 * g, 8, 128, k + 1, 8 * 196, 196, shu)
        assert (p.hpb, p.ncw, p.nchb, p.shu, p.ubuf) == (4, ncw, 1, True, ubuf), (g, k)
        d = mv.defines(8 * g, 8, 128, 16, 8 * 196, True, k + 1, shu)
        assert (d["SHU"], d["UBUF"], d["MINB"], d["QSMEM"], d["CB"], d["HS"]) == (1, ubuf, minb, 1, 784, 196)
        smem = mv.smem_bytes(shu, 784, 4 * ncw, 16, 128, 4, ubuf)
        assert smem <= mv.SMEM_MAX and (ncw > 2 or 2 * (smem + 1024) <= mv.SMEM_SM), (g, k, smem)
    # rows <= 16 never take it; a group of one KV head where the slots allow nothing else
    assert not mv.block_plan(32, 8, 128, 4, 8 * 196, 196, shu).shu
    assert mv.block_plan(4, 1, 128, 16, 196, 196, shu) == mv.BlockPlan(16, 4, 1, 4, True, 2)
    # head dim 256 (twice the accumulators) keeps a block per chunk of 16 rows; so does chunk_warps=1
    assert mv.block_plan(64, 8, 256, 4, 8 * 516, 516).ncw == 1 and mv.block_plan(64, 8, 256, 4, 8 * 516, 516).rc == 16
    assert mv.block_plan(64, 8, 128, 4, 8 * 196, 196, mv.VerifyConfig(chunk_warps=1)).nchb == 2
    # a head group whose slots are not 16-byte pieces of the row: all heads, fewer chunk warps
    odd = mv.block_plan(64, 8, 128, 8, 8 * 198, 198, T16)
    assert (odd.hpb, odd.ncw, odd.nchb) == (8, 2, 2)
    odd = mv.block_plan(64, 8, 128, 8, 8 * 198, 198)  # wide: 8 heads x 1 warp (<= 8 warps), two chunk blocks
    assert (odd.rc, odd.hpb, odd.ncw, odd.nchb) == (32, 8, 1, 2)
    odd = mv.block_plan(64, 8, 128, 8, 8 * 198, 198, shu)
    assert (odd.hpb, odd.ncw, odd.nchb, odd.shu, odd.ubuf) == (8, 2, 2, True, 1)
    # 16 KV heads and 32 rows: two groups of 8 heads (per-warp unpacking), four of 4 (shared unpack)
    wide = mv.block_plan(64, 16, 128, 8, 16 * 196, 196, T16)
    assert (wide.hpb, wide.ncw, wide.blocks(16)) == (8, 2, 2)
    assert mv.block_plan(64, 16, 128, 8, 16 * 196, 196).blocks(16) == 4  # one wide warp per head, 4 a block
    assert mv.block_plan(64, 16, 128, 8, 16 * 196, 196, shu).blocks(16) == 4


def test_split_count_depends_on_shape_only():
    for blocks in (8, 32, 64, 256, 512):
        s = mv.num_splits(blocks, 1, 132, 128, 1)
        assert 1 <= s <= 128
        if 132 // blocks <= 128:
            assert s == max(1, 132 // blocks)


def _case(d, hk, g, k, page, lens, seed=0, dtype=torch.bfloat16):
    gen = torch.Generator().manual_seed(seed)
    b = len(lens)
    per = max(1, -(-max(lens) // page))
    nb = b * per + 2
    cache = torch.zeros(nb, page, hk, Layout(d).slot_size_aligned, dtype=torch.uint8)
    bt = torch.randperm(nb, generator=gen)[: b * per].to(torch.int32).reshape(b, per).contiguous()
    for i, n in enumerate(lens):
        if n == 0:
            continue
        pos = torch.arange(n)
        slots = (bt[i, pos // page].long() * page + pos % page).to(torch.int32)
        kk = torch.randn(n, hk, d, generator=gen) * 1.5
        vv = torch.randn(n, hk, d, generator=gen) * 0.5 + 0.2
        reference.store(kk, vv, cache, slots)
    q = (torch.randn(b * (k + 1), hk * g, d, generator=gen)).to(dtype)
    return q, cache, bt, torch.tensor(lens, dtype=torch.int32)


def _rel(a, b):
    return ((a.double() - b).norm() / b.norm().clamp_min(1e-30)).item()


@pytest.mark.parametrize("k", [0, 1, 3, 5, 7])
@pytest.mark.parametrize("g", [1, 4, 6, 8])
def test_kernel_algorithm_matches_k_plus_1_decodes(k, g):
    # ragged; 37, 70: pages end mid-block; 3: shorter than K + 1 for K = 3, 7; 0: padding
    lens = [37, 70, 3, 0, 16 + k, 129]
    q, cache, bt, sl = _case(64, 2, g, k, 16, lens, seed=k * 10 + g)
    ref = reference.spec_verify(q, cache, bt, sl, 0.125, k)
    for splits in (1, 3, 16):
        emu = reference.emulate_verify(q, cache, bt, sl, 0.125, k, splits)
        assert _rel(emu, ref) < 1e-12, (splits, _rel(emu, ref))
    # rows that see no token are zeros, never NaN
    assert torch.isfinite(ref).all()


def test_reference_is_k_plus_1_separate_decodes():
    q, cache, bt, sl = _case(64, 2, 4, 3, 16, [40, 21], seed=3)
    ref = reference.spec_verify(q, cache, bt, sl, 0.1, 3).view(2, 4, 8, 64)
    for t in range(4):
        one = reference.decode(q.view(2, 4, 8, 64)[:, t], cache, bt, sl - 3 + t, 0.1)
        assert torch.equal(ref[:, t], one)


@pytest.mark.parametrize("k,g", [(0, 8), (1, 4), (3, 4), (3, 6), (7, 1), (7, 8)])
def test_fallback_synthetic_rows_match_reference(k, g, monkeypatch):
    """B (K + 1) rows through PK0001's decode: Triton under the interpreter on a CPU host; on a GPU host the
    same rows on the GPU, the Triton fallback asked for by name (SNDR_TQ_BACKEND=triton)."""
    from sndr.kernels.turboquant_k8v4 import kernels

    if not kernels.interpreting() and not torch.cuda.is_available():
        pytest.skip("needs TRITON_INTERPRET=1 (tests/kernels/conftest.py sets it without a GPU)")
    if kernels.interpreting():
        from sndr.kernels.turboquant_k8v4 import _interp

        _interp.fix_scalar_index()
        monkeypatch.delenv("SNDR_TQ_BACKEND", raising=False)
    else:  # compiled Triton cannot read CPU tensors
        monkeypatch.setenv("SNDR_TQ_BACKEND", "triton")
    lens = [37, 5 + k, 50]
    q, cache, bt, sl = _case(64, 2, g, k, 16, lens, seed=k + g)
    ref = reference.spec_verify(q, cache, bt, sl, 0.125, k)  # (the reference on the CPU)
    dev = "cpu" if kernels.interpreting() else "cuda"
    out = mv.verify_attention(*(t.to(dev) for t in (q, cache, bt, sl)), 0.125, k, max_splits=4).cpu()
    assert out.shape == q.shape and out.dtype == q.dtype
    assert _rel(out, ref) < 1e-2


def test_shape_checks_name_what_they_refuse():
    q, cache, bt, sl = _case(64, 2, 4, 3, 16, [20, 20])
    assert mv.shape_problem(q, cache, bt, sl, 3) is None
    assert "speculative tokens" in mv.shape_problem(q, cache, bt, sl, 16)
    assert "multiple of 2" in mv.shape_problem(q[:7], cache, bt, sl, 1)
    assert "query dtype" in mv.shape_problem(q.float(), cache, bt, sl, 3)
    assert "block table" in mv.shape_problem(q, cache, bt.long(), sl, 3)
    assert "seq_lens" in mv.shape_problem(q, cache, bt, sl.long(), 3)
    assert "head dim 96" in mv.shape_problem(torch.zeros(8, 8, 96, dtype=torch.bfloat16), cache, bt, sl, 3)
    assert "group size" in mv.shape_problem(torch.zeros(8, 6, 64, dtype=torch.bfloat16), torch.zeros(
        4, 16, 4, Layout(64).slot_size_aligned, dtype=torch.uint8), bt, sl, 3)
    assert mv.unsupported(q, cache, bt, sl, 3) == "not a CUDA device"


def test_input_errors():
    q, cache, bt, sl = _case(64, 2, 4, 3, 16, [20, 20])
    with pytest.raises(ValueError, match="multiple of K"):
        mv.verify_attention(q[:7], cache, bt, sl, 0.1, 3)
    with pytest.raises(ValueError, match="3 requests"):
        mv.verify_attention(torch.cat([q, q[:4]]), cache, bt, sl, 0.1, 3)


def test_cuda_backend_env_refuses_what_it_cannot_run(monkeypatch):
    q, cache, bt, sl = _case(64, 2, 4, 3, 16, [20, 20])
    monkeypatch.setenv("SNDR_TQ_BACKEND", "cuda")
    with pytest.raises(ValueError, match="not a CUDA device"):
        mv.verify_attention(q, cache, bt, sl, 0.1, 3)
    monkeypatch.setenv("SNDR_TQ_BACKEND", "fast")
    with pytest.raises(ValueError, match="SNDR_TQ_BACKEND='fast'"):
        mv.verify_attention(q, cache, bt, sl, 0.1, 3)


def test_first_call_inside_a_capture_records_synthetic_rows(monkeypatch):
    q, cache, bt, sl = _case(64, 2, 4, 3, 16, [20, 20])
    monkeypatch.delenv("SNDR_TQ_BACKEND", raising=False)
    monkeypatch.setattr(mv, "unsupported", lambda *a: None)
    monkeypatch.setattr(mv, "_device_index", lambda t: 0)
    monkeypatch.setattr(mv, "_capturing", lambda: True)
    monkeypatch.setattr(mv, "_build", lambda key: pytest.fail("built inside a capture"))
    monkeypatch.setattr(mv, "synthetic_rows", lambda *a, **kw: "synthetic")
    assert mv.verify_attention(q, cache, bt, sl, 0.1, 3) == "synthetic"
    monkeypatch.setenv("SNDR_TQ_BACKEND", "cuda")
    with pytest.raises(RuntimeError, match="prepare"):
        mv.verify_attention(q, cache, bt, sl, 0.1, 3)


def test_sm89_uses_synthetic_rows(monkeypatch):
    q, cache, bt, sl = _case(64, 2, 4, 3, 16, [20, 20])
    monkeypatch.setattr(_cudart, "_CAPABILITY", {0: (8, 9)})  # (the device facts' one home)
    fake = type("Q", (), {"device": torch.device("cuda", 0)})()  # only the device is read before the check
    monkeypatch.setattr(mv.torch.version, "hip", None)
    assert "sm_90" in mv.unsupported(fake, cache, bt, sl, 3)
    monkeypatch.setattr(mv, "_BROKEN", {0: "the canary failed here"})  # a backend marked off on that device
    assert mv.unsupported(fake, cache, bt, sl, 3) == "the canary failed here"


def test_the_device_gate_takes_a_tensor_or_a_device_and_names_the_capability(monkeypatch):
    """``_cudart.device_refusal``, the one device gate (PK0002's route, PK0003's entries, the kernels' launch
    gates, ``prepare``): a CPU or ROCm device is not a CUDA device; a capability below the kernel's is refused
    with ``need``, its ``{sm}`` the device's; the same answers for a tensor and for its ``torch.device``."""
    monkeypatch.setattr(_cudart, "_CAPABILITY", {0: (8, 6), 1: (9, 0)})
    monkeypatch.setattr(mv.torch.version, "hip", None)
    assert _cudart.device_refusal(torch.device("cpu"), (0, 0), "") == "not a CUDA device"
    assert _cudart.device_refusal(torch.zeros(1), (0, 0), "") == "not a CUDA device"
    d0, d1 = torch.device("cuda", 0), torch.device("cuda", 1)
    assert _cudart.device_refusal(d0, (8, 9), "{sm} (sm_89+ covered)") == "sm_86 (sm_89+ covered)"
    fake = type("T", (), {"device": d0})()  # a tensor: only its device is read
    assert _cudart.device_refusal(fake, (8, 9), "{sm} (sm_89+ covered)") == "sm_86 (sm_89+ covered)"
    assert _cudart.device_refusal(d1, (9, 0), "needs sm_90") is None
    assert _cudart.device_refusal(d1, (9, 0), "x", broken={1: "marked off"}) == "marked off"
    monkeypatch.setenv("SNDR_TQ_BACKEND", "cuda")
    monkeypatch.setattr(mv, "_build", lambda key: pytest.fail("built on an sm_86 device"))
    assert mv.prepare(0, torch.bfloat16, 32, 8, 128, 16, 3) is False  # sm_86: refused before any build
    monkeypatch.setattr(mv.torch.version, "hip", "6.2")
    assert _cudart.device_refusal(d1, (0, 0), "") == "not a CUDA device"


def test_every_kernel_python_launches_is_defined_in_the_sources():
    import re

    text = mv.source()
    defined = set(re.findall(r'extern "C" __global__ void __launch_bounds__\([^)]*\)\s+(\w+)\(', text))
    assert {mv.KERNEL, mv.MERGE, mv.MERGE_ROWS} <= defined


@pytest.mark.parametrize("g,k,ws", [(8, 3, True), (4, 5, True), (4, 7, True), (6, 3, True), (8, 5, False),
                                    (8, 7, False), (4, 3, False), (8, 1, False)])
def test_warp_specialised_pair_plan(g, k, ws):
    """VerifyConfig(ws=1) takes the wide one-chunk plan only (17..32 rows per KV head at head dim 128): a score
    warp and a P.V warp per KV head, 16 warps per SM, registers split by setmaxnreg (sm_90a); 48 and 64 rows
    (16-row warps, two wide warps) and <= 16 rows keep their kernels, built exactly as without it."""
    cfg = mv.VerifyConfig(ws=1)
    plan = mv.block_plan(8 * g, 8, 128, k + 1, 8 * 196, 196, cfg)
    defs = mv.defines(8 * g, 8, 128, 16, 8 * 196, True, k + 1, cfg)
    assert plan.ws is ws
    if not ws:
        assert defs == mv.defines(8 * g, 8, 128, 16, 8 * 196, True, k + 1) and mv.arch_suffix(defs) == ""
        return
    assert (plan.hpb, plan.warps, plan.blocks(8)) == (4, 8, 2)
    assert (defs["WSP"], defs["WS_SREG"], defs["WS_PREG"], defs["MINB"], defs["STAGES"]) == (1, 88, 168, 2, 4)
    assert (defs["SMX"], defs["QSMEM"], defs["NCH"], defs["ROWCOPY"]) == (1, 1, 1, 1)
    assert mv.arch_suffix(defs) == "a"
    # ring (4 stages of 16 rows of 784 bytes, 8-byte full / empty barriers), the 4 score warps' Q fragments,
    # two hand-off buffers per KV head of 4 NH + 1 words per lane (verify_k8v4.cu's XOFF, XWORDS)
    nh = -(-plan.rc // 8)
    assert mv.smem_bytes(cfg, 784, 4, plan.rc, 128, 0, 2, 4) == (
        4 * 16 * 784 + 16 * 4 + 4 * nh * 8 * 2 * 32 * 4 + 4 * 2 * (4 * nh + 1) * 32 * 4)
    eight = mv.block_plan(8 * g, 8, 128, k + 1, 8 * 196, 196, mv.VerifyConfig(ws=1, heads_per_block=8))
    assert (eight.ws, eight.warps) == (True, 16)
    assert mv.defines(8 * g, 8, 128, 16, 8 * 196, True, k + 1, mv.VerifyConfig(ws=1, heads_per_block=8))["MINB"] == 1
    # the two register counts split 2 x the launch's 128 a thread, in multiples of 8
    for bad in ((96, 168), (92, 164), (16, 240)):
        with pytest.raises(ValueError, match="ws_regs"):
            mv.defines(8 * g, 8, 128, 16, 8 * 196, True, k + 1, mv.VerifyConfig(ws=1, ws_regs=bad))
    # not at head dim 64, with SMX 0, or with Q fragments in registers
    for d, c in ((64, cfg), (128, mv.VerifyConfig(ws=1, softmax=0)), (128, mv.VerifyConfig(ws=1, qsmem=0))):
        assert not mv.block_plan(8 * g, 8, d, k + 1, 8 * 196, 196, c).ws


def test_per_warp_configs_never_route_to_the_wgmma_kernel():
    """mtp_verify.per_warp: the tests' and the benchmark's per-warp variants stay on verify_k8v4.cu at 17..64 rows."""
    cfg = mv.per_warp(unpack=1, stages=5)
    assert cfg == mv.VerifyConfig(wgmma=0, unpack=1, stages=5)
    assert verify_wg.uses(mv.DEFAULT, 64, 8, 128, 4, 8 * 196, 16)  # 32 rows: the default's wgmma kernel
    assert not any(verify_wg.uses(cfg, 8 * g, 8, 128, k + 1, 8 * 196, 16) for g in (3, 4, 6, 8) for k in (3, 5, 7))
