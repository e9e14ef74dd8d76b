"""The CUDA decode kernels on a GPU, against a float64 dequantise-then-attend.

Skipped without CUDA (sm_89+). Run on the H200 through the device tool:

    python3 -m pytest tests/kernels/test_tq_cuda_gpu.py -q

Caches start filled with 0xFF bytes (NaN keys, NaN scales) so that any read
of a slot past a sequence's end, or of a page it does not own, shows up.
"""

from __future__ import annotations

import dataclasses

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9):
    pytest.skip("needs a CUDA GPU with sm_89+", allow_module_level=True)

from sndr.kernels.turboquant_k8v4 import cache_store, cuda_decode, dispatch, reference  # noqa: E402
from sndr.kernels.turboquant_k8v4._layout import Layout  # noqa: E402

pytestmark = pytest.mark.gpu
DEV = "cuda"


def _case(d, hk, g, page, lens, qdtype=torch.bfloat16, seed=0, extra_pages=3):
    gen = torch.Generator(device=DEV).manual_seed(seed)
    b = len(lens)
    pages_per = max(1, -(-max(lens) // page))
    nb = b * pages_per + extra_pages
    cache = torch.full((nb, page, hk, Layout(d).slot_size_aligned), 0xFF, dtype=torch.uint8, device=DEV)
    perm = torch.randperm(nb, generator=gen, device=DEV)[: b * pages_per].to(torch.int32)
    bt = perm.reshape(b, pages_per).contiguous()
    for i, n in enumerate(lens):
        if n == 0:
            continue
        pos = torch.arange(n, device=DEV)
        slots = (bt[i, pos // page].long() * page + pos % page).to(torch.int32)
        k = torch.randn(n, hk, d, generator=gen, device=DEV) * 1.5
        v = torch.randn(n, hk, d, generator=gen, device=DEV) * 0.5 + 0.2
        cache_store.store(k.to(torch.bfloat16), v.to(torch.bfloat16), cache, slots)
    q = torch.randn(b, hk * g, d, generator=gen, device=DEV).to(qdtype)
    sl = torch.tensor(lens, dtype=torch.int32, device=DEV)
    return q, cache, bt, sl


def _ref(q, cache, bt, sl, scale):
    b, hq, d = q.shape
    page, hk = cache.shape[1], cache.shape[2]
    out = torch.zeros(b, hq, d, dtype=torch.float64, device=DEV)
    lse = torch.full((b, hq), float("-inf"), dtype=torch.float64, device=DEV)
    for i in range(b):
        n = int(sl[i])
        if n == 0:
            continue
        pos = torch.arange(n, device=DEV)
        k, v = reference.unpack(cache[bt[i, pos // page].long(), pos % page], d)
        k = k.double().transpose(0, 1).repeat_interleave(hq // hk, 0)
        v = v.double().transpose(0, 1).repeat_interleave(hq // hk, 0)
        s = torch.einsum("hd,hld->hl", q[i].double(), k) * scale
        out[i] = torch.einsum("hl,hld->hd", torch.softmax(s, -1), v)
        lse[i] = torch.logsumexp(s, -1)
    return out, lse


def _run(q, cache, bt, sl, scale, kind=None, out_dtype=torch.float32, max_splits=32):
    out = torch.empty(q.shape, dtype=out_dtype, device=DEV)
    lse = torch.empty(q.shape[:2], dtype=torch.float32, device=DEV)
    if kind is None:
        dispatch.decode_attention(q, cache, bt, sl, scale, out=out, lse=lse, max_splits=max_splits)
    else:
        cuda_decode.decode_attention(q, cache, bt, sl, scale, out=out, lse=lse, workspace=None,
                                     max_splits=max_splits, config=cuda_decode.CudaConfig(kind=kind))
    torch.cuda.synchronize()
    return out, lse


def _rel(a, b):
    return ((a.double() - b).norm() / b.norm().clamp_min(1e-30)).item()


LENS = [4096, 1, 15, 16, 17, 1000, 2047]


@pytest.mark.parametrize("kind", ["page", "warp"])
@pytest.mark.parametrize("d,hk,g,page,qdtype", [
    (128, 8, 4, 16, torch.bfloat16), (128, 8, 8, 16, torch.float16), (128, 4, 6, 32, torch.bfloat16),
    (128, 2, 16, 16, torch.bfloat16), (128, 1, 8, 64, torch.float16), (128, 16, 2, 16, torch.bfloat16),
    (64, 4, 8, 16, torch.bfloat16), (64, 2, 12, 32, torch.float16), (128, 8, 16, 16, torch.bfloat16),
    (256, 8, 4, 16, torch.bfloat16), (256, 2, 8, 32, torch.float16), (256, 4, 16, 16, torch.bfloat16),
])
def test_decode_matches_float64(kind, d, hk, g, page, qdtype):
    if d == 256 and kind == "warp":
        pytest.skip("head dim 256 runs the page kernel only")
    q, cache, bt, sl = _case(d, hk, g, page, LENS, qdtype, seed=d + hk + g)
    scale = d**-0.5
    assert cuda_decode.unsupported(q, cache, bt, sl) is None
    if kind == "page":
        assert cuda_decode.page_kind_ok(cache)
    ref, ref_lse = _ref(q, cache, bt, sl, scale)
    out, lse = _run(q, cache, bt, sl, scale, kind=kind)
    assert torch.isfinite(out).all()
    assert _rel(out, ref) < 5e-4
    assert (lse.double() - ref_lse).abs().max().item() < 1e-4


def test_default_path_runs_cuda_and_agrees_across_split_counts():
    q, cache, bt, sl = _case(128, 8, 4, 16, [8192, 3, 5000, 129], seed=3)
    ref, _ = _ref(q, cache, bt, sl, 0.1)
    cuda_decode._PLANS.clear()
    a, _ = _run(q, cache, bt, sl, 0.1)  # default path
    assert cuda_decode._PLANS, "dispatch.decode_attention did not take the CUDA path"
    b, _ = _run(q, cache, bt, sl, 0.1, kind="page", max_splits=4)  # more splits than 4 still allowed (128)
    c, _ = _run(q, cache, bt, sl, 0.1, kind="warp")
    for o in (a, b, c):
        assert _rel(o, ref) < 5e-4


def test_bf16_output_and_empty_sequences():
    q, cache, bt, sl = _case(128, 8, 8, 16, [0, 300, 0, 17], seed=5)
    out, _ = _run(q, cache, bt, sl, 0.09, out_dtype=torch.bfloat16)
    ref, _ = _ref(q, cache, bt, sl, 0.09)
    assert torch.isfinite(out.float()).all()
    assert out[0].abs().max().item() == 0 and out[2].abs().max().item() == 0
    assert _rel(out[[1, 3]], ref[[1, 3]]) < 4e-3  # bf16 rounding


def test_large_scores_and_scales_stay_finite():
    q, cache, bt, sl = _case(128, 8, 4, 16, [3000, 700], seed=9)
    q = q * 40  # scores far beyond exp range without the running max
    ref, _ = _ref(q, cache, bt, sl, 0.088)
    out, _ = _run(q, cache, bt, sl, 0.088)
    assert torch.isfinite(out).all()
    assert _rel(out, ref) < 1e-3


def test_cuda_graph_replay_with_new_lengths():
    q, cache, bt, sl = _case(128, 8, 4, 16, [4096, 4096, 4096], seed=11)
    out = torch.empty(q.shape, dtype=torch.bfloat16, device=DEV)
    ws = torch.empty(3 * 32 * 32 * 129, dtype=torch.float32, device=DEV)
    sl.fill_(1)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        dispatch.decode_attention(q, cache, bt, sl, 0.1, out=out, workspace=ws, max_splits=32)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        dispatch.decode_attention(q, cache, bt, sl, 0.1, out=out, workspace=ws, max_splits=32)
    for lens in ([4096, 5, 1234], [17, 4000, 1]):
        sl.copy_(torch.tensor(lens, dtype=torch.int32))
        g.replay()
        torch.cuda.synchronize()
        ref, _ = _ref(q, cache, bt, sl, 0.1)
        assert _rel(out, ref) < 4e-3


def test_cuda_and_triton_merges_agree():
    q, cache, bt, sl = _case(128, 8, 4, 16, [5000, 0, 77, 4096], seed=13)
    cfg, k, wps = cuda_decode.kernel_plan(q, cache, cuda_decode.DEFAULT)
    splits = cuda_decode.num_splits(4 * 8, wps, torch.cuda.get_device_properties(0).multi_processor_count, 128, 1)
    mid_o = torch.empty(4 * 32 * splits * 128, device=DEV)
    mid_l = torch.empty(4 * 32 * splits, device=DEV)
    cuda_decode.launch_split(k, cfg, q, cache, bt, sl, mid_o, mid_l, 0.1, splits, 2)
    outs = []
    for cuda in (True, False):
        out = torch.empty(q.shape, dtype=torch.float32, device=DEV)
        lse = torch.empty(q.shape[:2], dtype=torch.float32, device=DEV)
        cuda_decode.launch_merge(q, sl, mid_o, mid_l, out, lse, splits, 2, k, cuda=cuda)
        outs.append((out, lse))
    torch.cuda.synchronize()
    (a, la), (b, lb) = outs
    assert torch.allclose(a, b, rtol=1e-5, atol=1e-6)
    assert torch.equal(torch.isinf(la), torch.isinf(lb)) and torch.allclose(la[~torch.isinf(la)], lb[~torch.isinf(lb)])
    ref, _ = _ref(q, cache, bt, sl, 0.1)
    assert _rel(a, ref) < 5e-4


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_tensors_on_another_device_than_the_current_one():
    torch.cuda.set_device(1)
    q, cache, bt, sl = _case(128, 8, 4, 16, [3000, 17], seed=17)  # built on cuda:1
    ref, _ = _ref(q, cache, bt, sl, 0.1)
    torch.cuda.set_device(0)
    cuda_decode._PLANS.clear()
    for _ in range(2):  # first call loads the module for cuda:1, second reuses it
        out = torch.empty(q.shape, dtype=torch.float32, device=q.device)
        dispatch.decode_attention(q, cache, bt, sl, 0.1, out=out, max_splits=32)
        torch.cuda.synchronize(q.device)
        assert out.device.index == 1 and _rel(out, ref) < 5e-4
    assert cuda_decode._BROKEN == {}


@pytest.fixture
def merge_policy():
    """Set cuda_decode.MERGE_POLICY for one test; memoised plans are rebuilt around it."""
    from sndr.kernels.turboquant_k8v4 import dispatch

    old = dict(cuda_decode.MERGE_POLICY)

    def set_(eager, graph):
        cuda_decode.MERGE_POLICY.update(eager=eager, graph=graph)
        dispatch.reset()

    yield set_
    cuda_decode.MERGE_POLICY.update(old)
    dispatch.reset()


@pytest.mark.parametrize("mode", ["cuda", "pdl", "fold", "rows", "rows_pdl"])
@pytest.mark.parametrize("d,hk,g,page,qdtype", [
    (128, 8, 4, 16, torch.bfloat16), (64, 2, 12, 32, torch.float16), (256, 8, 4, 16, torch.bfloat16),
])
def test_merge_modes_eager_and_graph(mode, d, hk, g, page, qdtype, merge_policy):
    merge_policy(mode, mode)
    lens = [0, 4096, 1, 17, 1000]
    q, cache, bt, sl = _case(d, hk, g, page, lens, qdtype, seed=d + g + 21)
    ref, ref_lse = _ref(q, cache, bt, sl, d**-0.5)
    for _ in range(3):  # first call builds, the next ones reuse the counters / fast path
        out, lse = _run(q, cache, bt, sl, d**-0.5)
        assert _rel(out, ref) < 5e-4
        assert out[0].abs().max().item() == 0 and torch.isinf(lse[0]).all()
        assert (lse[1:].double() - ref_lse[1:]).abs().max().item() < 1e-4
    # graph: captured with other lengths, replayed
    out = torch.empty(q.shape, dtype=torch.bfloat16, device=DEV)
    lse = torch.empty(q.shape[:2], dtype=torch.float32, device=DEV)
    keep = sl.clone()
    sl.fill_(1)
    dispatch.decode_attention(q, cache, bt, sl, d**-0.5, out=out, lse=lse, max_splits=32)
    g_ = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g_):
        dispatch.decode_attention(q, cache, bt, sl, d**-0.5, out=out, lse=lse, max_splits=32)
    sl.copy_(keep)
    for _ in range(2):
        g_.replay()
        torch.cuda.synchronize()
        assert _rel(out[1:], ref[1:]) < 4e-3 and out[0].abs().max().item() == 0


def test_vllm_entry_fast_path_reuses_the_plan_and_stays_correct():
    from sndr.kernels.turboquant_k8v4 import dispatch, vllm_entry

    dispatch.reset()
    d, hk, g = 128, 8, 4
    q, cache, bt, sl = _case(d, hk, g, 16, [3000, 5, 800], seed=23)
    b, hq = q.shape[:2]
    mid = torch.empty(b, hq, 32, d + 1, dtype=torch.float32, device=DEV)
    ob = torch.empty(b, hq, d, dtype=torch.bfloat16, device=DEV)
    lb = torch.empty(b, hq, dtype=torch.float32, device=DEV)

    def call(qq):
        return vllm_entry.decode(qq, cache, bt, sl, torch.eye(d, device=DEV), torch.zeros(16, device=DEV), 0.09, 0,
                                 d, 4, key_fp8=True, mid_o_buf=mid, output_buf=ob, lse_buf=lb, max_num_kv_splits=32)

    for i in range(3):
        qq = q * (1 + i)  # new data each call, same metadata
        ob.fill_(float("nan"))
        r = call(qq)
        torch.cuda.synchronize()
        assert r is ob
        ref, ref_lse = _ref(qq, cache, bt, sl, 0.09)
        assert _rel(ob, ref) < 4e-3 and (lb.double() - ref_lse).abs().max().item() < 1e-3
        assert len(dispatch.ENTRY) == 1  # registered by the first call, hit by the others


def _check_merge_in_kernel(cfg, mode, d, hk, g, page, qdtype, seed):
    """A config whose page kernel merges by itself (mode "cluster" or "grid"): sequences of
    every kind (empty, one token, partial tiles, active splits not a multiple of anything),
    eager calls that reuse the arrival counters, f32 / bf16 outputs with and without the LSE,
    and graph replays with other lengths than at capture (the counters must be back at zero)."""
    lens = [0, 4096, 1, 17, 1000, 2047]
    q, cache, bt, sl = _case(d, hk, g, page, lens, qdtype, seed=seed)
    scale = d**-0.5
    ref, ref_lse = _ref(q, cache, bt, sl, scale)
    lp = cuda_decode.launch_plan(q, cache, bt, torch.empty(q.shape, device=DEV), None, 32, cfg)
    assert lp.mode(False) == lp.mode(True) == mode

    def run(out, lse):
        cuda_decode.decode_attention(q, cache, bt, sl, scale, out=out, lse=lse, workspace=None, max_splits=32,
                                     config=cfg)

    for i, dt in enumerate([torch.float32, torch.bfloat16, torch.float32]):
        out = torch.full(q.shape, float("nan"), dtype=dt, device=DEV)
        lse = torch.full(q.shape[:2], float("nan"), device=DEV) if i < 2 else None
        run(out, lse)
        torch.cuda.synchronize()
        assert _rel(out, ref) < (5e-4 if dt == torch.float32 else 4e-3)
        assert out[0].abs().max().item() == 0
        if lse is not None:
            assert torch.isinf(lse[0]).all() and (lse[1:].double() - ref_lse[1:]).abs().max().item() < 1e-4
    out = torch.empty(q.shape, dtype=torch.float32, device=DEV)
    lse = torch.empty(q.shape[:2], dtype=torch.float32, device=DEV)
    keep = sl.clone()
    sl.fill_(1)
    run(out, lse)
    g_ = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g_):
        run(out, lse)
    sl.copy_(keep)
    for _ in range(3):
        out.fill_(float("nan"))
        g_.replay()
        torch.cuda.synchronize()
        assert _rel(out[1:], ref[1:]) < 5e-4 and out[0].abs().max().item() == 0
        assert (lse[1:].double() - ref_lse[1:]).abs().max().item() < 1e-4
    return lp


@pytest.mark.parametrize("cl", [2, 4, 8])
@pytest.mark.parametrize("d,hk,g,page,qdtype", [
    (128, 8, 4, 16, torch.bfloat16), (128, 8, 8, 16, torch.float16), (64, 2, 12, 32, torch.float16),
    (256, 8, 4, 16, torch.bfloat16), (128, 1, 8, 64, torch.bfloat16), (128, 2, 2, 16, torch.bfloat16),
])
def test_cluster_merge_eager_and_graph(cl, d, hk, g, page, qdtype):
    """The page kernel that merges through clusters of splits (CudaConfig.cluster): also
    partial clusters and head slices that are empty (Hq < cluster)."""
    cfg = dataclasses.replace(cuda_decode.DEFAULT, cluster=cl, evict_first=cl != 2)
    lp = _check_merge_in_kernel(cfg, "cluster", d, hk, g, page, qdtype, seed=d + g + cl)
    assert lp.splits % cl == 0


@pytest.mark.parametrize("d,hk,g,page,qdtype", [
    (128, 8, 4, 16, torch.bfloat16), (128, 8, 8, 16, torch.float16), (256, 8, 4, 16, torch.bfloat16),
    (128, 8, 16, 32, torch.bfloat16),
])
def test_grid_merge_eager_and_graph(d, hk, g, page, qdtype):
    """The page kernel launched cooperatively, merging in its own grid (CudaConfig.grid_merge)."""
    cfg = dataclasses.replace(cuda_decode.DEFAULT, grid_merge=True)
    lp = _check_merge_in_kernel(cfg, "grid", d, hk, g, page, qdtype, seed=d + g + 40)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    assert lp.gridded is not None and lp.gridded.grid <= lp.gridded.kernel.blocks_per_sm(32 * hk) * sms


@pytest.mark.parametrize("d,hk,g,page,qdtype", [
    (128, 8, 4, 16, torch.bfloat16), (256, 2, 8, 32, torch.float16), (64, 4, 8, 16, torch.bfloat16),
])
def test_evict_first_reads_match_float64(d, hk, g, page, qdtype):
    """The page kernel reading the cache with an L2 evict-first policy (CudaConfig.evict_first)."""
    cfg = dataclasses.replace(cuda_decode.DEFAULT, evict_first=True)
    q, cache, bt, sl = _case(d, hk, g, page, LENS, qdtype, seed=d + hk + g + 5)
    ref, ref_lse = _ref(q, cache, bt, sl, d**-0.5)
    out = torch.empty(q.shape, dtype=torch.float32, device=DEV)
    lse = torch.empty(q.shape[:2], dtype=torch.float32, device=DEV)
    cuda_decode.decode_attention(q, cache, bt, sl, d**-0.5, out=out, lse=lse, workspace=None, max_splits=32,
                                 config=cfg)
    torch.cuda.synchronize()
    assert _rel(out, ref) < 5e-4 and (lse.double() - ref_lse).abs().max().item() < 1e-4
