"""The CUDA spec-verify kernel (``verify_k8v4.cu``) on a GPU, against float64.

Skipped without CUDA sm_90. Run on the H200 through the device tool:

    python3 -m pytest tests/kernels/test_mtp_verify_gpu.py -q

Caches start filled with 0xFF bytes (NaN keys, NaN scales), so a read past a
request's end or of a page it does not own shows up; outputs start as NaN, so
an unwritten row shows up.
"""

from __future__ import annotations

import dataclasses

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0):
    pytest.skip("needs a CUDA GPU with sm_90 (the verify kernel copies tiles with TMA)", allow_module_level=True)

from sndr.kernels.turboquant_k8v4 import cache_store, reference  # noqa: E402
from sndr.kernels.turboquant_k8v4 import mtp_verify as mv
from sndr.kernels.turboquant_k8v4._layout import Layout  # noqa: E402

pytestmark = pytest.mark.gpu
DEV = "cuda"


PW = mv.per_warp  # a variant of the per-warp kernel (verify_k8v4.cu) at every row count


def _case(d, hk, g, k, page, lens, qdtype=torch.bfloat16, seed=0, extra_pages=3, max_len=None):
    gen = torch.Generator(device=DEV).manual_seed(seed)
    b = len(lens)
    per = max(1, -(-(max_len or max(lens)) // page))
    nb = b * per + extra_pages
    cache = torch.full((nb, page, hk, Layout(d).slot_size_aligned), 0xFF, dtype=torch.uint8, device=DEV)
    bt = torch.randperm(nb, generator=gen, device=DEV)[: b * per].to(torch.int32).reshape(b, per).contiguous()
    _fill(cache, bt, lens, gen)
    q = torch.randn(b * (k + 1), hk * g, d, generator=gen, device=DEV).to(qdtype)
    return q, cache, bt, torch.tensor(lens, dtype=torch.int32, device=DEV)


def _fill(cache, bt, lens, gen, start=None):
    page, hk, d = cache.shape[1], cache.shape[2], _head_dim(cache)
    for i, n in enumerate(lens):
        lo = 0 if start is None else start[i]
        if n <= lo:
            continue
        pos = torch.arange(lo, n, device=DEV)
        slots = (bt[i, pos // page].long() * page + pos % page).to(torch.int32)
        k = torch.randn(n - lo, hk, d, generator=gen, device=DEV) * 1.5
        v = torch.randn(n - lo, hk, d, generator=gen, device=DEV) * 0.5 + 0.2
        cache_store.store(k.to(torch.bfloat16), v.to(torch.bfloat16), cache, slots)


def _head_dim(cache):
    for d in (64, 128, 256):
        if Layout(d).slot_size_aligned == cache.shape[3]:
            return d
    raise ValueError(cache.shape)


def _ref(q, cache, bt, sl, scale, k):
    """float64 on the GPU: K + 1 decode calls, call t with lengths seq_len - K + t."""
    n, hq, d = q.shape
    ql = k + 1
    b = n // ql
    page, hk = cache.shape[1], cache.shape[2]
    out = torch.zeros(b, ql, hq, d, dtype=torch.float64, device=DEV)
    qv = q.view(b, ql, hq, d)
    for i in range(b):
        full = int(sl[i])
        pos = torch.arange(max(full, 0), device=DEV)
        kk, vv = reference.unpack(cache[bt[i, pos // page].long(), pos % page], d)
        kk = kk.double().transpose(0, 1).repeat_interleave(hq // hk, 0)
        vv = vv.double().transpose(0, 1).repeat_interleave(hq // hk, 0)
        for t in range(ql):
            m = full - k + t
            if m <= 0:
                continue
            s = torch.einsum("hd,hld->hl", qv[i, t].double(), kk[:, :m]) * scale
            out[i, t] = torch.einsum("hl,hld->hd", torch.softmax(s, -1), vv[:, :m])
    return out.view(n, hq, d)


def _rel(a, b):
    return ((a.double() - b).norm() / b.norm().clamp_min(1e-30)).item()


def _verify(q, cache, bt, sl, scale, k, out_dtype=None, **kw):
    out = torch.full(q.shape, float("nan"), dtype=out_dtype or q.dtype, device=DEV)
    mv.verify_attention(q, cache, bt, sl, scale, k, out=out, **kw)
    torch.cuda.synchronize()
    return out


def _cuda_used(q, cache, k):
    """A CUDA verify kernel (per-warp or warpgroup-MMA) ran the default build, not the synthetic rows."""
    key = mv._key(q.device.index or 0, q.dtype, q.shape[1], cache.shape[2], q.shape[2], cache.shape[1],
                  cache.stride(1), cache.stride(2), k + 1, mv.DEFAULT)
    return key in mv._PLANS or key[:-1] + (True,) in mv._PLANS


@pytest.fixture(scope="module", autouse=True)
def _precompiled():
    """Every shape below, compiled in parallel threads first (NVRTC, a few seconds each)."""
    shapes = [(8 * g, 8, 128, 16, 8 * 196, True, k + 1) for k in (0, 1, 3, 5, 7) for g in (1, 4, 6, 8)]
    shapes += [(hk * g, hk, d, page, hk * Layout(d).slot_size_aligned, dt == torch.bfloat16, k + 1)
               for d, hk, g, k, page, dt in OTHER]
    shapes += [(32, 8, 128, 16, 8 * 196, True, 4), (64, 8, 128, 16, 8 * 196, True, 2),
               (64, 8, 128, 16, 8 * 196, True, 6), (32, 8, 128, 32, 8 * 196, True, 3),
               (32, 8, 128, 16, 8 * 196, True, 4, PW(qsmem=0))]
    shapes += [(8 * g, 8, 128, 16, 8 * 196, True, k + 1, cfg) for g, k in ((8, 3), (4, 5), (8, 7), (6, 5))
               for cfg in list(PLANS.values()) + list(UNPACK_PLANS.values())]
    shapes += [(8 * g, 8, 128, 16, 8 * 196, True, k + 1, TWO_CHAINS) for g, k in ((4, 3), (8, 7))]
    shapes += [(8 * g, 8, 128, 16, 8 * 196, True, k + 1, cfg) for g, k in WIDE_SHAPES for cfg in WIDE.values()]
    shapes += [(8 * g, 8, 128, 16, 8 * 196, True, k + 1, PW(softmax=x)) for g, k in SOFTMAX_SHAPES
               for x in (0, 1, 2)]
    shapes += [(8 * g, 8, 128, 16, 8 * 196, True, k + 1, PW(rows_per_warp=32, heads_per_block=4, softmax=1))
               for g, k in ((8, 3),)]
    shapes += [(8 * g, 8, 128, 16, 8 * 196, True, k + 1, c) for g, k in WS_SHAPES
               for cfg in WS.values() for c in (cfg, _per_warp(cfg), dataclasses.replace(cfg, max_splits=128))]
    shapes += [(8 * g, 8, 128, 16, 8 * 196, True, k + 1, cfg) for g, k in WG_SHAPES for cfg in WG.values()]
    shapes += [(8 * g, 8, 128, 16, 8 * 196, True, k + 1, cfg) for g, k in SMALL_SHAPES
               for cfg in (mv.DEFAULT, WS_ALL, PW())]
    mv.precompile(shapes, workers=12)


@pytest.fixture(autouse=True)
def _cuda_backend(monkeypatch):
    monkeypatch.setenv("SNDR_TQ_BACKEND", "cuda")  # a kernel that cannot run fails the test, no fallback


PLANS = {  # 16-row warps, per-warp unpacking; at most 8 splits for all
    "one warp per head, a block per chunk": PW(chunk_warps=1, max_splits=8),
    "shared tile, 4 heads per block": PW(rows_per_warp=16, heads_per_block=4, max_splits=8),
    "shared tile, 2 chunk warps": PW(rows_per_warp=16, chunk_warps=2, max_splits=8),
    "shared tile, 2 heads, 4 stages": PW(rows_per_warp=16, heads_per_block=2, stages=4, max_splits=8),
}
UNPACK_PLANS = {  # the shared-unpack CTA (unpack=1: measured slower, not the default), at most 8 splits
    "shared unpack, its plan": PW(unpack=1, max_splits=8),
    "shared unpack, 8 heads, one unpacked tile": PW(unpack=1, heads_per_block=8, unpack_buffers=1,
                                                    max_splits=8),
    "shared unpack, 2 chunk warps, two unpacked tiles": PW(unpack=1, chunk_warps=2, unpack_buffers=2,
                                                           max_splits=8),
    "shared unpack, 4 stages": PW(unpack=1, stages=4, max_splits=8),
}
TWO_CHAINS = PW(kchain=2, rows_per_warp=16)  # two score accumulator chains per n-tile (a variant)


@pytest.mark.parametrize("k", [0, 1, 3, 5, 7])
@pytest.mark.parametrize("g", [1, 4, 6, 8])
def test_verify_matches_float64(k, g):
    # ragged, pages ending mid-block, one request shorter than K + 1, one of exactly K + 1
    lens = [1000, 37, 4097, 5, k + 1, 300]
    q, cache, bt, sl = _case(128, 8, g, k, 16, lens, seed=10 * k + g)
    out = _verify(q, cache, bt, sl, 0.088, k)
    assert _cuda_used(q, cache, k)
    ref = _ref(q, cache, bt, sl, 0.088, k)
    assert not out.isnan().any()
    assert _rel(out, ref) < 1e-2


OTHER = [
    (64, 4, 8, 3, 16, torch.float16), (256, 8, 4, 3, 16, torch.bfloat16), (256, 4, 8, 1, 32, torch.bfloat16),
    (128, 16, 2, 3, 64, torch.bfloat16), (128, 2, 16, 3, 16, torch.float16), (128, 1, 4, 15, 16, torch.bfloat16),
]


@pytest.mark.parametrize("d,hk,g,k,page,qdtype", OTHER)
def test_verify_other_shapes(d, hk, g, k, page, qdtype):
    lens = [700, 33, 2 * page + 5, 1]
    q, cache, bt, sl = _case(d, hk, g, k, page, lens, qdtype=qdtype, seed=d + k)
    out = _verify(q, cache, bt, sl, d ** -0.5, k, out_dtype=torch.float32)
    ref = _ref(q, cache, bt, sl, d ** -0.5, k)
    assert not out.isnan().any()
    assert _rel(out, ref) < 1e-2


@pytest.mark.parametrize("qsmem", [0, 1])
def test_q_fragments_in_registers_or_shared_memory(qsmem):
    lens = [3000, 45, 1]
    q, cache, bt, sl = _case(128, 8, 4, 3, 16, lens, seed=31)
    out = _verify(q, cache, bt, sl, 0.088, 3, config=PW(qsmem=qsmem))
    assert not out.isnan().any()
    assert _rel(out, _ref(q, cache, bt, sl, 0.088, 3)) < 1e-2


@pytest.mark.parametrize("g,k", [(8, 3), (4, 5), (8, 7), (6, 5)])
@pytest.mark.parametrize("family", ["per-warp unpacking", "shared unpack"])
def test_every_block_plan_gives_the_same_rows(g, k, family):
    """Per-warp unpacking: the one-warp-per-head kernel (a block per 16-row chunk) and the shared-tile CTAs
    (chunk warps of one or several KV heads on one copied tile, partial token rows); shared unpack: the
    shared-unpack CTA with 4 or 8 heads, one or two unpacked tiles, 3 or 4 stages. Within a family, plans
    with the same split count (it follows blocks per SM) meet the same tiles with the same arithmetic in the
    same order: their outputs are bitwise equal; all match float64."""
    lens = [4100, 37, 5, k + 1, 1000]
    q, cache, bt, sl = _case(128, 8, g, k, 16, lens, seed=7 * g + k)
    ref = _ref(q, cache, bt, sl, 0.088, k)
    outs = {}
    plans = PLANS if family == "per-warp unpacking" else UNPACK_PLANS
    for name, cfg in plans.items():
        outs[name] = _verify(q, cache, bt, sl, 0.088, k, out_dtype=torch.float32, config=cfg, max_splits=8)
        plan = mv.block_plan(8 * g, 8, 128, k + 1, 8 * 196, 196, cfg)
        assert plan.shu == (family == "shared unpack") or plan.ncw == 1, (name, plan)
        assert not outs[name].isnan().any(), name
        assert _rel(outs[name], ref) < 1e-2, (name, plan)
    by_splits: dict[int, list] = {}
    for name, cfg in plans.items():
        by_splits.setdefault(_splits(q, cache, k, cfg, len(lens)), []).append(name)
    assert max(len(v) for v in by_splits.values()) >= 2, by_splits  # something to compare bitwise
    for names in by_splits.values():
        for name in names[1:]:
            assert torch.equal(outs[name], outs[names[0]]), (name, names[0])


def _splits(q, cache, k, cfg, b):
    """The split count _launch gives this call (what the block plan's blocks per SM lead to)."""
    idx = q.device.index or 0
    key = mv._key(idx, q.dtype, q.shape[1], cache.shape[2], q.shape[2], cache.shape[1], cache.stride(1),
                  cache.stride(2), k + 1, cfg)
    blocks_per_sm, per_split = mv._PLANS[key][2:4]
    return mv.num_splits(b * per_split, blocks_per_sm, mv._sm_count(idx), min(mv.MAX_SPLITS, max(8, cfg.max_splits)),
                         cfg.waves)


WIDE = {  # wide warps: up to 32 query rows a warp (3-4 n-tiles on one tile unpacked in registers; the default
    # at 17..32 and 64 rows per KV head)
    "wide warps": PW(rows_per_warp=32),
    "wide warps, 4 heads a block": PW(rows_per_warp=32, heads_per_block=4),
}
WIDE_SHAPES = [(8, 3), (4, 5), (4, 7), (8, 5), (8, 7), (6, 5)]


@pytest.mark.parametrize("name", list(WIDE))
@pytest.mark.parametrize("g,k", WIDE_SHAPES)
def test_wide_warps_match_float64(g, k, name):
    """24-32 rows in one warp (G = 8 K = 3: one warp per KV head), 48-64 rows in two on one copied tile;
    ragged, pages ending mid-block, contexts <= K + 1, on poisoned caches."""
    cfg = WIDE[name]
    plan = mv.block_plan(8 * g, 8, 128, k + 1, 8 * 196, 196, cfg)
    assert plan.rc > 16 and plan.warps <= 8, plan
    lens = [4100, 37, 5, k + 1, 1000]
    q, cache, bt, sl = _case(128, 8, g, k, 16, lens, seed=3 * g + k)
    out = _verify(q, cache, bt, sl, 0.088, k, out_dtype=torch.float32, config=cfg)
    assert not out.isnan().any()
    assert _rel(out, _ref(q, cache, bt, sl, 0.088, k)) < 1e-2


SOFTMAX_SHAPES = [(1, 0), (8, 1), (4, 3), (8, 3), (4, 5), (8, 5), (8, 7)]  # <= 16 rows, wide warps, 48 rows


@pytest.mark.parametrize("smx", [1, 2])
@pytest.mark.parametrize("g,k", SOFTMAX_SHAPES)
def test_softmax_paths_match_float64(g, k, smx):
    """The per-warp kernel's cheaper softmax paths (VerifyConfig.softmax: 1 softmax_tile_mma, 2 the same with
    ex2.approx.f16x2) against float64 and against softmax_tile (0) on the same plan: ragged, pages ending
    mid-block, contexts <= K + 1, a long context (lazy rescales), on poisoned caches, float32 outputs. Path 1
    keeps test_errors_equal_to_plain_decode's bound (1.25x the reference path's error + 1e-4); path 2 rounds
    the exponent to fp16 before ex2 and may lose up to 2x."""
    lens = [4100, 37, 5, k + 1, 1000, 16, 9000]
    q, cache, bt, sl = _case(128, 8, g, k, 16, lens, seed=50 + 3 * g + k)
    ref = _ref(q, cache, bt, sl, 0.088, k)
    base = _rel(_verify(q, cache, bt, sl, 0.088, k, out_dtype=torch.float32, config=PW(softmax=0)), ref)
    out = _verify(q, cache, bt, sl, 0.088, k, out_dtype=torch.float32, config=PW(softmax=smx))
    assert not out.isnan().any()
    err = _rel(out, ref)
    print(f"G={g} K={k} softmax={smx}: rel err {err:.3e} (softmax_tile {base:.3e})")
    assert err < 1e-2
    assert err < (1.25 if smx == 1 else 2.0) * base + 1e-4, (g, k, smx, err, base)


def _graph_replay_with_new_lengths(cfg, g: int, k: int, seed: int, fill_seed: int, b: int = 3) -> None:
    """Capture one verify call of ``cfg`` at ``b`` (<= 3) 64-token requests, then replay it with new lengths (4999 /
    3 / 700, then 1 / 4096 / 65, the first b; the caches filled as they grow): every output row against float64."""
    lens0 = [64] * b
    q, cache, bt, sl = _case(128, 8, g, k, 16, lens0, seed=seed, max_len=5000)
    out = torch.full(q.shape, float("nan"), dtype=torch.float32, device=DEV)
    mv.verify_attention(q, cache, bt, sl, 0.088, k, out=out, config=cfg)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        mv.verify_attention(q, cache, bt, sl, 0.088, k, out=out, config=cfg)
    gen = torch.Generator(device=DEV).manual_seed(fill_seed)
    for lens in ([4999, 3, 700][:b], [1, 4096, 65][:b]):
        _fill(cache, bt, lens, gen, start=lens0)
        lens0 = [max(a, b) for a, b in zip(lens0, lens)]
        sl.copy_(torch.tensor(lens, dtype=torch.int32))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert not out.isnan().any()
        assert _rel(out, _ref(q, cache, bt, sl, 0.088, k)) < 1e-2, lens


@pytest.mark.parametrize("smx", [0, 1])
def test_wide_warps_graph_replay_with_new_lengths(smx):
    _graph_replay_with_new_lengths(PW(rows_per_warp=32, heads_per_block=4, softmax=smx), 8, 3, 6, 11)


@pytest.mark.parametrize("g,k", [(4, 3), (8, 7)])
def test_two_accumulator_chains_match_float64(g, k):
    lens = [3000, 45, 1, k + 1]
    q, cache, bt, sl = _case(128, 8, g, k, 16, lens, seed=40 + g + k)
    out = _verify(q, cache, bt, sl, 0.088, k, out_dtype=torch.float32, config=TWO_CHAINS)
    assert not out.isnan().any()
    assert _rel(out, _ref(q, cache, bt, sl, 0.088, k)) < 1e-2


def test_errors_equal_to_plain_decode():
    """The verify kernel's error against float64 is PK0001's (same tiles, same arithmetic)."""
    lens = [8192, 5000, 777, 16384]
    for g, k in ((4, 3), (8, 1), (8, 5), (8, 7)):
        q, cache, bt, sl = _case(128, 8, g, k, 16, lens, seed=g + k)
        ref = _ref(q, cache, bt, sl, 0.088, k)
        ours = _rel(_verify(q, cache, bt, sl, 0.088, k, out_dtype=torch.float32), ref)
        rows = mv.synthetic_rows(q, cache, bt, sl, 0.088, k, out=torch.empty(q.shape, dtype=torch.float32,
                                                                               device=DEV))
        theirs = _rel(rows, ref)
        assert ours < 1.25 * theirs + 1e-4, (g, k, ours, theirs)


@pytest.mark.parametrize("g,k", [(4, 3), (8, 7)])
def test_graph_capture_then_replay_with_new_lengths(g, k):
    lens0 = [64, 64, 64, 64]
    q, cache, bt, sl = _case(128, 8, g, k, 16, lens0, seed=5, max_len=9000)
    out = torch.full(q.shape, float("nan"), dtype=q.dtype, device=DEV)
    mv.verify_attention(q, cache, bt, sl, 0.088, k, out=out)  # builds outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        mv.verify_attention(q, cache, bt, sl, 0.088, k, out=out)
    gen = torch.Generator(device=DEV).manual_seed(9)
    for lens in ([8999, 17, 4, 3000], [1, 2000, 8192, 65], [0, 0, 100, 9000]):
        _fill(cache, bt, lens, gen, start=lens0)
        lens0 = [max(a, b) for a, b in zip(lens0, lens)]
        sl.copy_(torch.tensor(lens, dtype=torch.int32))
        q.copy_(torch.randn(q.shape, generator=gen, device=DEV).to(q.dtype))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        ref = _ref(q, cache, bt, sl, 0.088, k)
        assert not out.isnan().any()
        assert _rel(out, ref) < 1e-2, lens


def test_capture_without_prepare_records_synthetic_rows_and_prepare_avoids_it(monkeypatch):
    monkeypatch.setenv("SNDR_TQ_BACKEND", "auto")
    k, g = 2, 4
    q, cache, bt, sl = _case(128, 8, g, k, 32, [500, 90], seed=8)
    monkeypatch.setattr(mv, "_PLANS", {})
    out = torch.empty_like(q)
    mv.synthetic_rows(q, cache, bt, sl, 0.088, k, out=out)  # PK0001's kernels for these rows, built eagerly
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        mv.verify_attention(q, cache, bt, sl, 0.088, k, out=out)
    assert not mv._PLANS
    graph.replay()
    torch.cuda.synchronize()
    assert _rel(out, _ref(q, cache, bt, sl, 0.088, k)) < 1e-2
    assert mv.prepare(q.device, q.dtype, q.shape[1], 8, 128, 32, k)
    assert _cuda_used(q, cache, k)


# the warp-specialised pair (VerifyConfig.ws: a score warp and a P.V warp per KV head, sm_90a); at most 4 splits (the
# caller's cap and the config's), so that the per-warp kernel it is compared with gets the same split count (a
# different number of blocks per SM gives another one: 6 stages leave one block per SM)
WS = {
    "ws": PW(ws=1, max_splits=4),
    "ws, 8 heads a block": PW(ws=1, heads_per_block=8, max_splits=4),
    "ws, 3 stages": PW(ws=1, ws_stages=3, max_splits=4),
    "ws, 6 stages": PW(ws=1, ws_stages=6, max_splits=4),
}
WS_SHAPES = [(8, 3), (4, 5), (4, 7), (6, 3)]


def _per_warp(cfg):
    """The per-warp kernel on the same plan (wide warps, softmax_tile_mma, the same heads per block)."""
    return dataclasses.replace(cfg, ws=0, rows_per_warp=32, heads_per_block=cfg.heads_per_block or cfg.wide_heads,
                               softmax=1)


@pytest.mark.parametrize("name", list(WS))
@pytest.mark.parametrize("g,k", WS_SHAPES)
def test_warp_specialised_pair_is_the_per_warp_kernel_bit_for_bit(g, k, name):
    """The same operations on the same values, split over two warps per KV head: outputs bit for bit those of the
    per-warp kernel with softmax_tile_mma at the same split count, 4 (ragged lengths, pages ending mid-block,
    contexts <= K + 1, a long context with lazy rescales, one-tile splits, on 0xFF-poisoned caches), and within
    float64's bound with the default split count."""
    cfg = WS[name]
    assert mv.block_plan(8 * g, 8, 128, k + 1, 8 * 196, 196, cfg).ws
    lens = [4100, 37, 5, k + 1, 1000, 16, 9000, 17]
    q, cache, bt, sl = _case(128, 8, g, k, 16, lens, seed=70 + 3 * g + k)
    out = _verify(q, cache, bt, sl, 0.088, k, out_dtype=torch.float32, config=cfg, max_splits=4)
    base = _verify(q, cache, bt, sl, 0.088, k, out_dtype=torch.float32, config=_per_warp(cfg), max_splits=4)
    assert not out.isnan().any()
    assert torch.equal(out, base), (out - base).abs().max().item()
    ref = _ref(q, cache, bt, sl, 0.088, k)
    full = _verify(q, cache, bt, sl, 0.088, k, out_dtype=torch.float32, config=dataclasses.replace(cfg, max_splits=128))
    assert _rel(full, ref) < 1e-2 and _rel(out, ref) < 1e-2


@pytest.mark.parametrize("g,k", [(8, 3), (4, 7)])
def test_warp_specialised_pair_graph_replay_with_new_lengths(g, k):
    _graph_replay_with_new_lengths(dataclasses.replace(WS["ws"], max_splits=128), g, k, 16, 17)



@pytest.mark.parametrize("d,hk,g,k,lens,cap", [
    (128, 8, 8, 3, [8192, 5000, 777, 3, 0], 4),  # a verify step's few splits, an empty request, a context <= K + 1
    (128, 8, 4, 7, [40000], 16),  # one request, 16 splits: the most the warp merge takes (MERGE_ROWS_MAX_SPLITS)
    (128, 8, 8, 3, [40000, 9], 128),  # more splits: both configs run the block merge
    (64, 4, 8, 1, [3000, 1], 48),  # head dim 64: two dims a lane
    (256, 8, 4, 3, [9000, 20], 40),  # head dim 256: eight dims a lane
])
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16])
def test_warp_per_row_merge_matches_the_block_merge_and_float64(d, hk, g, k, lens, cap, out_dtype):
    """tq_k8v4_merge_rows (the default, VerifyConfig.merge_rows, up to 16 splits a request) against tq_k8v4_merge on
    the same partials: the same weights and sums (its FMA chain may round differently), zeros for a request with no
    token; and against float64."""
    q, cache, bt, sl = _case(d, hk, g, k, 16, lens, seed=7 * d + g + k)
    cfg = mv.VerifyConfig(max_splits=cap)
    rows = _verify(q, cache, bt, sl, 0.088, k, out_dtype=out_dtype, config=cfg, max_splits=cap)
    block = _verify(q, cache, bt, sl, 0.088, k, out_dtype=out_dtype, config=dataclasses.replace(cfg, merge_rows=0),
                    max_splits=cap)
    assert any(key[9] == cfg for key in mv._PLANS)  # the CUDA kernel ran, not the synthetic rows
    assert not rows.isnan().any()
    tol = 1e-6 if out_dtype == torch.float32 else 1e-2
    assert torch.allclose(rows.float(), block.float(), rtol=tol, atol=tol), (rows.float() - block.float()).abs().max()
    assert _rel(rows.float(), _ref(q, cache, bt, sl, 0.088, k)) < 1e-2


# The warpgroup-MMA kernels (verify_wgmma.cu, sm_90a): one block per (request, split, KV head), all rows of a KV
# head in one m64 tile, f16 score and P.V wgmmas on keys and values converted once a tile; one warpgroup
# (tq_k8v4_verify_wg) or a converting and an MMA warpgroup (tq_k8v4_verify_ws: WGS).
WG1 = mv.VerifyConfig(wgmma=1, wg=mv.verify_wg.WgConfig(f16_stages=0))
WGS = mv.VerifyConfig(wgmma=1)  # (the default shape)
WG = {
    "wgmma": WG1,
    "specialised": WGS,
    "specialised, 2 tiles a stage, 4 f16 stages": mv.VerifyConfig(
        wgmma=1, wg=mv.verify_wg.WgConfig(2, 4, 2, f16_stages=4)),
    "specialised, 1 block, 3 f16 stages": mv.VerifyConfig(
        wgmma=1, wg=mv.verify_wg.WgConfig(4, 2, 1, f16_stages=3, regs=(96, 232))),
    "specialised, 8 splits": mv.VerifyConfig(wgmma=1, max_splits=8),
    "wgmma, 1 tile a stage": mv.VerifyConfig(wgmma=1, wg=mv.verify_wg.WgConfig(1, 6, 3, f16_stages=0)),
    "wgmma, 2 tiles a stage, 3 blocks": mv.VerifyConfig(wgmma=1, wg=mv.verify_wg.WgConfig(2, 4, 3, f16_stages=0)),
    "wgmma, 2 stages, 8 splits": mv.VerifyConfig(wgmma=1, wg=mv.verify_wg.WgConfig(stages=2, f16_stages=0),
                                                max_splits=8),
    # round 8's layout: rows 16 w + g and + 8 at <= 32 rows, an f16 stage freed after the next stage's scores
    "specialised, round 8": mv.VerifyConfig(wgmma=1, wg=mv.verify_wg.WgConfig(spread_rows=False, early_free=False)),
    # verify_tr.cu: keys and values unpacked into the registers of the warps that multiply them (round 10)
    "transposed": mv.VerifyConfig(wgmma=1, wg=mv.verify_wg.WgConfig(transposed=True)),
    "transposed, 4 stages, 8 splits": mv.VerifyConfig(wgmma=1, wg=mv.verify_wg.WgConfig(stages=4, transposed=True),
                                                     max_splits=8),
    # (TR_DBG 2: every stage takes the raise path, exchanging the warps' maxima and rewriting P: the same outputs)
    "transposed, raise every stage": mv.VerifyConfig(wgmma=1, wg=mv.verify_wg.WgConfig(transposed=True, debug=2)),
}
WGT = WG["transposed"]
WG_SHAPES = [(8, 3), (4, 5), (4, 7), (8, 5), (8, 7), (6, 5), (3, 7), (4, 15)]


def _wg_used(q, cache, k, cfg):
    key = mv._key(q.device.index or 0, q.dtype, q.shape[1], cache.shape[2], q.shape[2], cache.shape[1],
                  cache.stride(1), cache.stride(2), k + 1, cfg, True)
    return key in mv._PLANS


@pytest.mark.parametrize("name", list(WG))
@pytest.mark.parametrize("g,k", WG_SHAPES)
def test_wgmma_kernel_matches_float64_and_the_per_warp_kernel(g, k, name):
    """17..64 rows per KV head; ragged, pages ending mid-block, contexts <= K + 1, a request longer than one split,
    on poisoned caches (NaN keys and scales past every request's end): float64, and the per-warp kernel's error."""
    cfg = WG[name]
    lens = [4100, 37, 5, k + 1, 1000, 1]
    q, cache, bt, sl = _case(128, 8, g, k, 16, lens, seed=5 * g + k)
    out = _verify(q, cache, bt, sl, 0.088, k, out_dtype=torch.float32, config=cfg)
    assert _wg_used(q, cache, k, cfg)
    assert not out.isnan().any()
    ref = _ref(q, cache, bt, sl, 0.088, k)
    base = _verify(q, cache, bt, sl, 0.088, k, out_dtype=torch.float32)
    err, err_base = _rel(out, ref), _rel(base, ref)
    assert err < 1e-2 and err < 1.5 * err_base + 1e-4, (err, err_base)


@pytest.mark.parametrize("f16_stages", [0, 2], ids=["wg", "ws"])
@pytest.mark.parametrize("g,k", [(8, 3), (4, 5), (3, 7), (6, 5)])
def test_row_layout_and_stage_release_change_no_bit(g, k, f16_stages):
    """<= 32 rows spread over the four warps, and an f16 stage freed as soon as its P.V is done, move work between
    warps but not one operation of any row: the outputs equal round 8's bit for bit (36 rows: the same build)."""
    q, cache, bt, sl = _case(128, 8, g, k, 16, [4100, 37, k + 1, 1000], seed=7 * g + k)
    outs = [_verify(q, cache, bt, sl, 0.088, k, out_dtype=torch.float32, config=mv.VerifyConfig(
        wgmma=1, wg=mv.verify_wg.WgConfig(f16_stages=f16_stages, spread_rows=on, early_free=on))) for on in (True, False)]
    assert not outs[0].isnan().any()
    assert torch.equal(outs[0], outs[1])


@pytest.mark.parametrize("name", ["wgmma", "specialised", "transposed"])
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("g,k,lens", [(8, 5, [5000, 300, 6]), (8, 7, [4096, 77]), (8, 3, [3000, 40])])
def test_wgmma_kernel_few_long_requests(g, k, lens, out_dtype, name):
    """The batches of vLLM's layer harness (test_mtp_routing): few requests, so many splits each (a split of
    two tiles, half a stage, for the 300-token one), on a poisoned cache; bf16 outputs as vLLM's."""
    cfg = WG[name]
    q, cache, bt, sl = _case(128, 8, g, k, 16, lens, seed=g + k + len(lens))
    out = _verify(q, cache, bt, sl, 128 ** -0.5, k, out_dtype=out_dtype, config=cfg)
    assert _wg_used(q, cache, k, cfg)
    assert not out.isnan().any()
    assert _rel(out.float(), _ref(q, cache, bt, sl, 128 ** -0.5, k)) < 1e-2


@pytest.mark.parametrize("cfg", [WG1, WGS, WGT], ids=["wg", "ws", "tr"])
@pytest.mark.parametrize("hk,g,k,page", [(4, 8, 3, 32), (8, 8, 7, 64), (16, 4, 7, 16), (4, 16, 3, 16)])
def test_wgmma_kernel_other_heads_and_pages(hk, g, k, page, cfg):
    q, cache, bt, sl = _case(128, hk, g, k, page, [3000, 77, k + 1, 260], seed=hk + g + k + page)
    out = _verify(q, cache, bt, sl, 0.088, k, out_dtype=torch.float32, config=cfg)
    assert _wg_used(q, cache, k, cfg)
    assert not out.isnan().any()
    assert _rel(out, _ref(q, cache, bt, sl, 0.088, k)) < 1e-2


@pytest.mark.parametrize("cfg", [WG1, WGS, WGT], ids=["wg", "ws", "tr"])
def test_wgmma_kernel_large_queries_keep_their_precision(cfg):
    """Queries of very different magnitudes per row (1e-3 .. 1e3): each row's power-of-two scale keeps its bf16
    values exact in f16, so the error stays the per-warp kernel's."""
    q, cache, bt, sl = _case(128, 8, 8, 3, 16, [2000, 900], seed=11)
    scale = torch.logspace(-3, 3, q.shape[0] * q.shape[1], device=DEV).view(q.shape[0], q.shape[1], 1)
    q = (q.float() * scale / 30).to(torch.bfloat16)
    out = _verify(q, cache, bt, sl, 0.088, 3, out_dtype=torch.float32, config=cfg)
    ref = _ref(q, cache, bt, sl, 0.088, 3)
    base = _verify(q, cache, bt, sl, 0.088, 3, out_dtype=torch.float32)
    assert not out.isnan().any()
    assert _rel(out, ref) < 1.5 * _rel(base, ref) + 1e-4


@pytest.mark.parametrize("cfg", [WG1, WGS, WGT], ids=["wg", "ws", "tr"])
def test_wgmma_kernel_fp16_queries(cfg):
    q, cache, bt, sl = _case(128, 8, 8, 5, 16, [3000, 100, 6], qdtype=torch.float16, seed=21)
    out = _verify(q, cache, bt, sl, 0.088, 5, out_dtype=torch.float32, config=cfg)
    assert _wg_used(q, cache, 5, cfg)
    ref = _ref(q, cache, bt, sl, 0.088, 5)
    base = _verify(q, cache, bt, sl, 0.088, 5, out_dtype=torch.float32)
    assert not out.isnan().any()
    assert _rel(out, ref) < 1.5 * _rel(base, ref) + 1e-4


@pytest.mark.parametrize("cfg", [WG1, WGS, WGT], ids=["wg", "ws", "tr"])
@pytest.mark.parametrize("g,k", [(8, 3), (8, 7)])
def test_wgmma_kernel_graph_replay_with_new_lengths(g, k, cfg):
    _graph_replay_with_new_lengths(cfg, g, k, 7, 13)


# Below 17 rows per KV head the default runs the specialised kernel at the batches of verify_wg.SMALL_BATCH: 4 to 16
# rows, G 1 to 8
WS_ALL = mv.VerifyConfig(wgmma=2)  # (the specialised kernel at every row count)
SMALL_SHAPES = [(4, 3), (8, 1), (6, 1), (2, 7), (1, 7), (4, 1), (1, 3)]


@pytest.mark.parametrize("b", [1, 2, 3])
@pytest.mark.parametrize("g,k", SMALL_SHAPES)
def test_small_batches_below_17_rows_route_by_batch_size(g, k, b):
    """The default's output is the specialised kernel's bit for bit where verify_wg.uses routes this batch to it,
    else the per-warp kernel's; on poisoned caches, ragged (a request of K + 1 tokens, one of several splits), the
    specialised kernel's error within the per-warp kernel's, both against float64."""
    lens = [4100, k + 1, 37][:b]
    q, cache, bt, sl = _case(128, 8, g, k, 16, lens, seed=3 * g + k + b)
    out = _verify(q, cache, bt, sl, 0.088, k, out_dtype=torch.float32)
    ws = _verify(q, cache, bt, sl, 0.088, k, out_dtype=torch.float32, config=WS_ALL)
    pw = _verify(q, cache, bt, sl, 0.088, k, out_dtype=torch.float32, config=PW())
    routed = mv.verify_wg.uses(mv.DEFAULT, 8 * g, 8, 128, k + 1, 8 * 196, 16, b)
    assert routed == (b <= (2 if g * (k + 1) > 8 else 1))
    assert torch.equal(out, ws if routed else pw)
    assert _wg_used(q, cache, k, WS_ALL)
    assert not ws.isnan().any()
    ref = _ref(q, cache, bt, sl, 0.088, k)
    err, err_pw = _rel(ws, ref), _rel(pw, ref)
    assert err < 1e-2 and err < 1.5 * err_pw + 1e-4, (err, err_pw)


@pytest.mark.parametrize("g,k,b", [(4, 3, 1), (4, 3, 2), (8, 1, 2), (1, 7, 1)])
def test_small_batch_route_graph_replay_with_new_lengths(g, k, b):
    """The default captured at a batch it routes to the specialised kernel, replayed with new lengths."""
    assert mv.verify_wg.uses(mv.DEFAULT, 8 * g, 8, 128, k + 1, 8 * 196, 16, b)
    _graph_replay_with_new_lengths(mv.DEFAULT, g, k, 9, 17, b=b)
