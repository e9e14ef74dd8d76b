"""Replayed GDN spec verify on the GPU at the 35B-A3B head shape (16 key heads, 32 value heads, K = V = 128).

The CPU test's multi-step property (``_gdn_replay_sim``: admissions, random acceptance and
rejection, finishes with slot reuse, mixed steps that leave replay through ``materialize``)
with compiled kernels: after every step the replayed outputs against PK0003's snapshot
kernel and against vLLM's snapshot semantics in float64 arithmetic
(``reference.post_conv_mtp``), and at the end every live request's materialised snapshots.
On the GPU, GdnReplay runs its CUDA kernel (``replay.cu``), whose reduction order over K
differs from the Triton snapshot kernel's, so the comparison with the snapshot kernel is a
tolerance here (stated below), bit for bit on the CPU (where both are Triton).

The CUDA kernel's own exactness, bit for bit: a token replayed at the next step gives the
state the token's own pass had in registers (one T-token step vs T one-token steps that each
replay the previous token: equal outputs and states), and the base a step writes after
replaying ``acc`` tokens equals the snapshot ``materialize`` writes for column ``acc - 1``,
for both pool dtypes. Also: the replayed step captured in a CUDA graph and replayed over
steps with new accepted counts and slots gives the eager results.
"""

from __future__ import annotations

import os
import sys

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU (the CPU interpreter tests are test_gdn_replay.py)", allow_module_level=True)
pytest.importorskip("triton")
hyp = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
import _gdn_replay_sim as sim_mod  # noqa: E402

from sndr.kernels.gdn import replay  # noqa: E402

pytestmark = pytest.mark.gpu

H, HV, K, V = 16, 32, 128, 128
BF = torch.bfloat16
#: relative L2, per step. vs float64: the bf16 outputs are rounded before and after the norm.
OUT_TOL = 1.5e-2
#: replay vs the snapshot kernel: the same float32 recurrence, possibly contracted differently
REP_SNAP_OUT = 2e-3
STATE_TOL = {torch.float32: 1e-5, torch.bfloat16: 1.5e-2}
REP_SNAP_STATE = {torch.float32: 1e-6, torch.bfloat16: 5e-3}
STATS: dict = {"steps": 0, "bitwise_steps": 0, "max_rep_snap": 0.0, "max_rep_f64": 0.0}


def _rel(x, ref) -> float:
    x, ref = x.double(), ref.double()
    return ((x - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def _check(sim):
    o_ref, o_snap, o_rep = sim.last
    STATS["steps"] += 1
    STATS["bitwise_steps"] += int(torch.equal(o_rep, o_snap))
    rs, rf = _rel(o_rep, o_snap), _rel(o_rep, o_ref)
    STATS["max_rep_snap"] = max(STATS["max_rep_snap"], rs)
    STATS["max_rep_f64"] = max(STATS["max_rep_f64"], rf)
    assert rs <= REP_SNAP_OUT, (sim.log[-1], rs)
    assert rf <= OUT_TOL, (sim.log[-1], rf)


def _final(sim, dtype):
    got = sim.final_snapshots()
    if got is None:
        return
    ref, snap, rep = got
    assert _rel(rep, snap) <= REP_SNAP_STATE[dtype], _rel(rep, snap)
    assert _rel(rep, ref) <= STATE_TOL[dtype], _rel(rep, ref)


OPS = st.lists(
    st.one_of(
        st.tuples(st.just("admit"), st.just(0)),
        st.tuples(st.just("finish"), st.integers(0, 7)),
        st.tuples(st.sampled_from(["step", "step", "step", "mixed"]), st.integers(1, 63)),
    ),
    min_size=4, max_size=12,
)


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=OPS, dtype=st.sampled_from([torch.float32, BF]), cols=st.sampled_from([2, 4, 8]),
       seed=st.integers(0, 2**16), persistent=st.sampled_from([None, "copy", "l2"]))
def test_replay_property_35b_shape(ops, dtype, cols, seed, persistent):
    sim = sim_mod.Sim(H=H, HV=HV, K=K, V=V, cols=cols, n_slots=1 + 6 * cols, state_dtype=dtype, device="cuda",
                      seed=seed)
    if persistent:  # the same property on a persistent step (nothing has run on the sim's buffer yet)
        sim.rep = replay.GdnReplay(sim.rep_state, H, max_tokens=cols, max_requests=64, persistent=persistent)
    assert sim.rep.backend == "cuda"
    for _ in range(3):
        sim.admit()
    sim_mod.run_schedule(sim, [("step", 7)] + list(ops), _check)
    _final(sim, dtype)


def test_report_stats():
    """Prints what the property saw (runs after it in file order)."""
    print("replay GPU property:", STATS)
    assert STATS["steps"] == 0 or STATS["max_rep_f64"] > 0


@pytest.mark.parametrize("persistent", [None, "copy"])
@pytest.mark.parametrize("dtype", [torch.float32, BF])
def test_graph_capture_and_replay_new_accepted_and_slots(dtype, persistent):
    """One captured step replayed four times with new accepted counts and new slots (a request's rows moved)."""
    cols, n = 4, 8
    g = torch.Generator(device="cuda").manual_seed(5)
    slots = 1 + 2 * n * cols
    st0 = (torch.randn(slots, HV, V, K, generator=g, device="cuda") * 0.1).to(dtype)
    width = 2 * H * K + HV * V
    perm = (torch.randperm(slots - 1, generator=g, device="cuda") + 1).to(torch.int32)
    idx_all = perm[: 2 * n * cols].reshape(2 * n, cols)
    cu = torch.arange(0, n * cols + 1, cols, dtype=torch.int32, device="cuda")
    A_log = torch.rand(HV, generator=g, device="cuda") * 2 - 1
    dt_bias = torch.rand(HV, generator=g, device="cuda") * 2 - 1
    w = (torch.rand(V, generator=g, device="cuda") + 0.5).to(BF)
    steps = []
    for s in range(5):
        qkvz = torch.randn(n * cols, width + HV * V, generator=g, device="cuda").to(BF)
        ba = torch.randn(n * cols, 2 * HV, generator=g, device="cuda").to(BF)
        rows = torch.randperm(2 * n, generator=g, device="cuda")[:n] if s % 2 else torch.arange(n, device="cuda")
        acc = torch.randint(1, cols + 1, (n,), generator=g, device="cuda", dtype=torch.int32)
        steps.append((qkvz, ba, idx_all[rows].contiguous(), acc))

    def run(pool, rep, bufs, record):
        for qkvz, ba, idx, acc in steps:
            bufs["qkvz"].copy_(qkvz)
            bufs["ba"].copy_(ba)
            bufs["idx"].copy_(idx)
            bufs["acc"].copy_(acc)
            if record is None:
                rep.step(*args(bufs, pool))
            else:
                record.replay()
            bufs.setdefault("outs", []).append(bufs["out"].clone())
        return bufs["outs"]

    def args(bufs, pool):
        b, a = bufs["ba"].chunk(2, dim=-1)
        return (bufs["qkvz"][:, :width], a, b, A_log, dt_bias, bufs["idx"], cu, bufs["acc"], pool,
                bufs["qkvz"][:, width:].view(n * cols, HV, V), w, bufs["out"], K**-0.5, 1e-6, "silu")

    def new_bufs():
        return {"qkvz": torch.empty_like(steps[0][0]), "ba": torch.empty_like(steps[0][1]),
                "idx": torch.empty_like(steps[0][2]), "acc": torch.empty_like(steps[0][3]),
                "out": torch.empty(n * cols, HV, V, dtype=BF, device="cuda")}

    pool_e = st0.clone()
    rep_e = replay.GdnReplay(pool_e, H, max_tokens=cols, max_requests=n, persistent=persistent)
    eager = run(pool_e, rep_e, new_bufs(), None)

    pool_g = st0.clone()
    rep_g = replay.GdnReplay(pool_g, H, max_tokens=cols, max_requests=n, persistent=persistent)
    bufs = new_bufs()
    # warm up on a scratch pool copy (compiles, allocates the norm workspace), then capture
    scratch = st0.clone()
    rep_w = replay.GdnReplay(scratch, H, max_tokens=cols, max_requests=n, persistent=persistent)
    for k_, v_ in zip(("qkvz", "ba", "idx", "acc"), steps[0]):
        bufs[k_].copy_(v_)
    rep_w.step(*args(bufs, scratch))
    rep_g._ws = rep_w._ws
    # the warm-up's loaded kernels (module load, shared-memory attribute) and grid size (an
    # occupancy query): none of these host calls inside the capture
    rep_g._cuda_kernels = rep_w._cuda_kernels
    rep_g._grid_cap = rep_w._grid_cap
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        rep_g.step(*args(bufs, pool_g))
    # capture ran nothing: the pool and the side buffer are as they were
    assert torch.equal(pool_g, st0) and int(rep_g.side.meta[:, :, 1].abs().sum()) == 0
    graphed = run(pool_g, rep_g, bufs, graph)
    for i, (e, gr) in enumerate(zip(eager, graphed)):
        assert torch.equal(e, gr), i
    assert torch.equal(pool_e, pool_g)


def _batch(n, cols, dtype, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    slots = 1 + n * cols
    pool = (torch.randn(slots, HV, V, K, generator=g, device="cuda") * 0.1).to(dtype)
    idx = (torch.randperm(slots - 1, generator=g, device="cuda") + 1).to(torch.int32).reshape(n, cols).contiguous()
    width = 2 * H * K + HV * V

    def inputs():
        qkvz = torch.randn(n * cols, width + HV * V, generator=g, device="cuda").to(BF)
        ba = torch.randn(n * cols, 2 * HV, generator=g, device="cuda").to(BF)
        b, a = ba.chunk(2, dim=-1)
        return qkvz[:, :width], a, b, qkvz[:, width:].view(n * cols, HV, V)

    A_log = torch.rand(HV, generator=g, device="cuda") * 2 - 1
    dt_bias = torch.rand(HV, generator=g, device="cuda") * 2 - 1
    w = (torch.rand(V, generator=g, device="cuda") + 0.5).to(BF)
    return pool, idx, inputs, A_log, dt_bias, w


#: the CUDA kernel configs the benchmark may pick (lanes per state row, rows per thread, blocks per SM,
#: L2 prefetch): run 4's one-kernel autotune candidates, the two defaults among them
CFGS = [(8, 4, 2, True), (8, 2, 2, True), (8, 4, 2, False)]


def _cfg_id(c):
    return f"P{c[0]}R{c[1]}M{c[2]}{'' if c[3] else '-nopf'}"


def _kw(cfg):
    return {"threads_per_row": cfg[0], "rows_per_thread": cfg[1], "min_blocks": cfg[2], "prefetch": cfg[3]}


@pytest.mark.parametrize("cfg", CFGS, ids=_cfg_id)
@pytest.mark.parametrize("cols", [4, 8])
def test_cuda_replay_reproduces_its_own_token_pass_bit_for_bit(cols, cfg):
    """One step of `cols` tokens (then materialised) vs `cols` one-token steps, each replaying the
    previous token from the side buffer: the outputs of every token and the base after every
    replay are bit-identical to the in-register trajectory of the one step (fp32 pool: no
    step-boundary rounding in between)."""
    n = 8
    pool0, idx, inputs, A_log, dt_bias, w = _batch(n, cols, torch.float32, 11)
    x, a, b, z = inputs()
    one = torch.ones(n, dtype=torch.int32, device="cuda")
    pool_a = pool0.clone()
    kw = _kw(cfg)
    rep_a = replay.GdnReplay(pool_a, H, max_tokens=cols, max_requests=n, **kw)
    assert rep_a.backend == "cuda"
    out_a = torch.empty(n * cols, HV, V, dtype=BF, device="cuda")
    cu_a = torch.arange(0, n * cols + 1, cols, dtype=torch.int32, device="cuda")
    rep_a.step(x, a, b, A_log, dt_bias, idx, cu_a, one, pool_a, z, w, out_a, K**-0.5, 1e-6)
    rep_a.materialize(idx[:, 0])
    out_a = out_a.view(n, cols, HV, V)

    pool_b = pool0.clone()
    rep_b = replay.GdnReplay(pool_b, H, max_tokens=cols, max_requests=n, **kw)
    cu_b = torch.arange(0, n + 1, dtype=torch.int32, device="cuda")
    col0 = idx[:, :1]
    s0 = idx[:, 0].long()
    for j in range(cols):
        def sl(t, j=j):
            return t.view(n, cols, *t.shape[1:])[:, j]

        out_b = torch.empty(n, HV, V, dtype=BF, device="cuda")
        rep_b.step(sl(x), sl(a), sl(b), A_log, dt_bias, col0, cu_b, one, pool_b, sl(z), w, out_b, K**-0.5, 1e-6)
        assert torch.equal(out_b, out_a[:, j]), j
        if j:  # the base this step wrote: token j - 1 replayed, == the one step's state after token j - 1
            assert torch.equal(pool_b[s0], pool_a[idx[:, j - 1].long()]), j
    rep_b.materialize(idx[:, 0])
    assert torch.equal(pool_b[s0], pool_a[idx[:, cols - 1].long()])


@pytest.mark.parametrize("cfg", CFGS, ids=_cfg_id)
@pytest.mark.parametrize("dtype", [torch.float32, BF])
def test_cuda_replayed_base_equals_the_materialised_snapshot(dtype, cfg):
    """After a step of 4 tokens, the next step's base (acc tokens replayed, rounded to the pool
    dtype) equals, bit for bit, the snapshot ``materialize`` writes for column acc - 1."""
    n, cols = 8, 4
    pool0, idx, inputs, A_log, dt_bias, w = _batch(n, cols, dtype, 12)
    cu = torch.arange(0, n * cols + 1, cols, dtype=torch.int32, device="cuda")
    one = torch.ones(n, dtype=torch.int32, device="cuda")
    acc = (torch.arange(n, device="cuda") % cols + 1).to(torch.int32)
    step1, step2 = inputs(), inputs()
    out = torch.empty(n * cols, HV, V, dtype=BF, device="cuda")
    pool1, pool2 = pool0.clone(), pool0.clone()
    kw = _kw(cfg)
    rep1 = replay.GdnReplay(pool1, H, max_tokens=cols, max_requests=n, **kw)
    rep2 = replay.GdnReplay(pool2, H, max_tokens=cols, max_requests=n, **kw)
    rep1.step(*step1[:3], A_log, dt_bias, idx, cu, one, pool1, step1[3], w, out, K**-0.5, 1e-6)
    rep1.materialize(idx[:, 0])
    rep2.step(*step1[:3], A_log, dt_bias, idx, cu, one, pool2, step1[3], w, out, K**-0.5, 1e-6)
    rep2.step(*step2[:3], A_log, dt_bias, idx, cu, acc, pool2, step2[3], w, out, K**-0.5, 1e-6)
    want = idx[torch.arange(n, device="cuda"), acc.long() - 1].long()
    assert torch.equal(pool2[idx[:, 0].long()], pool1[want])


@pytest.mark.parametrize("dtype", [torch.float32, BF])
def test_cuda_and_triton_replay_agree(dtype):
    """The two backends on the same two steps: outputs and written bases within float32 reduction-order
    differences (their sums over K run in different orders)."""
    n, cols = 8, 4
    pool0, idx, inputs, A_log, dt_bias, w = _batch(n, cols, dtype, 13)
    cu = torch.arange(0, n * cols + 1, cols, dtype=torch.int32, device="cuda")
    one = torch.ones(n, dtype=torch.int32, device="cuda")
    acc = (torch.arange(n, device="cuda") % cols + 1).to(torch.int32)
    steps = [(inputs(), one), (inputs(), acc)]
    res = {}
    for backend in ("cuda", "triton"):
        pool = pool0.clone()
        rep = replay.GdnReplay(pool, H, max_tokens=cols, max_requests=n, backend=backend)
        outs = []
        for (x, a, b, z), ac in steps:
            out = torch.empty(n * cols, HV, V, dtype=BF, device="cuda")
            rep.step(x, a, b, A_log, dt_bias, idx, cu, ac, pool, z, w, out, K**-0.5, 1e-6)
            outs.append(out)
        res[backend] = (outs, pool)
    for oc, ot in zip(res["cuda"][0], res["triton"][0]):
        assert _rel(oc, ot) <= REP_SNAP_OUT
    assert _rel(res["cuda"][1], res["triton"][1]) <= REP_SNAP_STATE[dtype]


#: the step variants that must give the default one-kernel step's bits: the persistent grids, and the row sums
#: by one xor butterfly each instead of the default reduce-scatter (alone and in the TMA-copy grid)
VARIANTS = {"copy": {"persistent": "copy"}, "l2": {"persistent": "l2"}, "butterfly": {"scatter_sums": False},
            "butterfly-copy": {"persistent": "copy", "scatter_sums": False}}


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("dtype", [torch.float32, BF])
def test_persistent_steps_equal_the_one_kernel_step_bit_for_bit(dtype, variant):
    """A persistent grid (48 requests: 1536 tiles, several per resident block, so each block loops and
    brings its next tile in during this one: "copy" by TMA into shared memory, "l2" by an L2
    prefetch), and gdn_replay_step on the same four steps (first step, partial and full acceptance,
    a padding row and an out-of-range count, then a third of the requests invalidated: one launch
    mixing first-step tiles, read from a snapshot column, with replayed ones): equal outputs, pools
    and side buffers. Likewise the row sums by one butterfly each (``scatter_sums=False``), one tile per block
    or in the copy grid."""
    n, cols = 48, 4
    pool0, idx, inputs, A_log, dt_bias, w = _batch(n, cols, dtype, 14)
    idx[3, 0] = 0  # a padding row
    cu = torch.arange(0, n * cols + 1, cols, dtype=torch.int32, device="cuda")
    accs = [torch.ones(n, dtype=torch.int32, device="cuda"),
            (torch.arange(n, device="cuda") % cols + 1).to(torch.int32),
            torch.full((n,), cols, dtype=torch.int32, device="cuda"),
            (torch.arange(n, device="cuda") % cols + 1).flip(0).to(torch.int32)]
    accs[1][5] = cols + 1  # outside [1, cols]: zero outputs, no state
    steps = [inputs() for _ in accs]
    kw = VARIANTS[variant]
    res = {}
    for on in (True, False):
        pool = pool0.clone()
        rep = replay.GdnReplay(pool, H, max_tokens=cols, max_requests=n, **(kw if on else {}))
        outs = []
        for i, ((x, a, b, z), ac) in enumerate(zip(steps, accs)):
            if i == 3:
                rep.invalidate(idx[::3, 0])
            out = torch.full((n * cols, HV, V), float("nan"), dtype=BF, device="cuda")
            rep.step(x, a, b, A_log, dt_bias, idx, cu, ac, pool, z, w, out, K**-0.5, 1e-6)
            outs.append(out)
        if on and kw.get("persistent"):  # fewer resident blocks than tiles: the blocks looped
            assert 0 < max(rep._grid_cap.values()) < n * HV, rep._grid_cap
        res[on] = (outs, pool, rep.side)
    for o1, o2 in zip(res[True][0], res[False][0]):
        assert torch.equal(o1, o2)
    assert torch.equal(res[True][1], res[False][1])
    s1, s2 = res[True][2], res[False][2]
    assert torch.equal(s1.meta, s2.meta) and torch.equal(s1.k, s2.k) and torch.equal(s1.v, s2.v)
    assert torch.equal(s1.gb, s2.gb)
