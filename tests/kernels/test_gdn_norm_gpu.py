"""The GDN step with the gated RMSNorm fused, compiled on a GPU: against float64 and vLLM's CUDA op.

Skipped without CUDA. Run on the H200 through the device tool:

    python3 -m pytest tests/kernels/test_gdn_norm_gpu.py -q

The 35B-A3B head shape (16 key heads, 32 value heads, K = V = 128), bf16 activations as
the layer hands them (views of its projections), float32 and bfloat16 pools, T = 1..4
and 8. Against the float64 recurrence + RMSNormGated (``reference``): relative Frobenius
error of the bf16 outputs <= 4e-3 (the output is rounded to bf16 before the norm, as
vLLM's unfused path stores it, and after: about 2.3e-3 measured, vLLM's op alike), at
most 1.05x the error of vLLM's CUDA op against the same float64 values plus 1e-4, and
<= 4e-3 from the op's outputs (where the op loads: vLLM 0.32.0's ``_C_stable_libtorch.abi3.so`` in ``.gpu/``, git-ignored;
else those comparisons skip, saying so); written states <= 1e-5 (float32 pool) or
<= 4e-3 (bf16 pool). Graph capture and replay: a step captured once replays correctly
after new lengths (ragged, empty requests), new slots (padding -1 / 0), new accepted
counts and new inputs are written into the captured buffers.
"""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 0):
    pytest.skip("needs a CUDA GPU with sm_80+", allow_module_level=True)

from sndr.kernels.gdn import canary, cuda_step, reference, routing, vllm_entry  # noqa: E402

pytestmark = pytest.mark.gpu
DEV = "cuda"
H, HV, K, V = 16, 32, 128, 128
BF = torch.bfloat16
LIB = Path(__file__).resolve().parents[2] / ".gpu" / "_C_stable_libtorch.abi3.so"


def _op():
    if not hasattr(torch.ops._C, "fused_gdn_decode_post_conv_mtp") and LIB.is_file():
        torch.ops.load_library(str(LIB))
    return getattr(torch.ops._C, "fused_gdn_decode_post_conv_mtp", None) if hasattr(torch.ops, "_C") else None


try:
    OP = _op()
except Exception:  # noqa: BLE001 - reported by the tests that need it
    OP = None


@pytest.fixture(autouse=True)
def _every_cell(request, monkeypatch):
    """The correctness tests take every cell (``routing.measuring``), through the step their ``kernel``
    parameter names (``"triton"`` or ``"cuda"``: a fallback from the CUDA step fails the test); the routing
    tests (marked ``routed``) run the entries as vLLM's calls reach them."""
    if "routed" in request.keywords:
        yield
        return
    kernel = request.node.callspec.params.get("kernel") if hasattr(request.node, "callspec") else None
    if kernel == "cuda":
        if torch.cuda.get_device_capability() < (9, 0):
            pytest.skip("the CUDA step (step.cu: thread-block clusters) needs an sm_90+ GPU")

        def no_fallback(why):
            raise AssertionError(f"the CUDA step fell back to Triton: {why}")

        monkeypatch.setattr(cuda_step, "log_fallback", no_fallback)
    before = cuda_step.STATS["launches"]
    with routing.measuring(kernel):
        yield
    if kernel == "cuda":
        assert cuda_step.STATS["launches"] > before, "the CUDA step did not run"


KERNELS = pytest.mark.parametrize("kernel", ["triton", "cuda"])


def rel(a, b):
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


class Cell:
    def __init__(self, n, t, state_dtype, seed=0):
        g = torch.Generator(device=DEV).manual_seed(seed)
        self.n, self.t = n, t
        tok = n * t
        slots = tok + 4
        self.state = (torch.randn(slots, HV, V, K, generator=g, device=DEV) * 0.3).to(state_dtype)
        perm = torch.randperm(slots - 3, generator=g, device=DEV)[:tok] + 3
        self.idx = perm.reshape(n, t).to(torch.int32).contiguous()
        self.num_acc = torch.randint(1, t + 1, (n,), generator=g, device=DEV, dtype=torch.int32)
        self.cu = torch.arange(0, tok + 1, t, device=DEV, dtype=torch.int32)
        width = 2 * H * K + HV * V
        self.qkvz = torch.randn(tok, width + HV * V, generator=g, device=DEV).to(BF)
        self.mixed, self.gate = self.qkvz[:, :width], self.qkvz[:, width:].view(tok, HV, V)
        self.ba = torch.randn(tok, 2 * HV, generator=g, device=DEV).to(BF)
        self.b, self.a = self.ba.chunk(2, dim=-1)
        self.A_log = torch.rand(HV, generator=g, device=DEV) * 2 - 1
        self.dt_bias = torch.rand(HV, generator=g, device=DEV) * 2 - 1
        self.w = (torch.rand(V, generator=g, device=DEV) + 0.5).to(BF)
        self.out = torch.full((tok, HV, V), float("nan"), device=DEV, dtype=BF)

    def mtp(self):
        return vllm_entry.try_post_conv_mtp(self.mixed, self.a, self.b, self.A_log, self.dt_bias, self.idx, self.cu,
                                            self.num_acc, self.state, self.gate, self.w, self.out, K**-0.5, 1e-6,
                                            "silu")

    def decode(self):
        return vllm_entry.try_packed_decode_norm(self.mixed, self.a, self.b, self.A_log, self.dt_bias, K**-0.5,
                                                 self.state, self.out, self.idx[:, 0].contiguous(), self.gate,
                                                 self.w, 1e-6, "silu")

    def op(self):
        OP(self.mixed, self.a, self.b, self.A_log, self.dt_bias, self.idx, self.cu, self.num_acc, self.state,
           self.gate, self.w, self.out, K**-0.5, 1e-6, "silu")
        return self.out

    def ref64(self, acc=None):
        st = self.state.double()
        o = reference.post_conv_mtp_dense(self.mixed, self.a, self.b, self.A_log, self.dt_bias, self.idx,
                                          self.num_acc if acc is None else acc, st, self.gate, self.w, K**-0.5,
                                          1e-6, "silu")
        return o, st


def _state_tol(dt):
    return 1e-5 if dt == torch.float32 else 4e-3


@KERNELS
@pytest.mark.parametrize("state_dtype", [torch.float32, BF])
@pytest.mark.parametrize("n,t", [(1, 2), (8, 1), (8, 3), (33, 4), (8, 8), (64, 2), (3, 11), (256, 4)])
def test_mtp_and_decode_match_float64(n, t, state_dtype, kernel):
    c = Cell(n, t, state_dtype, seed=n * 10 + t)
    s0 = c.state.clone()
    written = c.idx.reshape(-1).long()
    o64, st64 = c.ref64()
    assert c.mtp() is c.out
    e_out = rel(c.out, o64)
    assert e_out <= 4e-3
    assert rel(c.state[written], st64[written]) <= _state_tol(state_dtype)
    if OP is not None and t <= 8:  # (T = 11: more tokens than a CTA stages at once; the op takes <= 8)
        o_s, st_s = c.out.clone(), c.state.clone()
        c.state.copy_(s0)
        c.out.fill_(float("nan"))
        c.op()
        e_op = rel(c.out, o64)
        assert e_out <= 1.05 * e_op + 1e-4, (e_out, e_op)
        assert rel(o_s, c.out) <= 4e-3
        assert rel(st_s[written], c.state[written]) <= _state_tol(state_dtype)
    if t == 1:  # the plain decode entry: column 0, no accepted counts
        c.state.copy_(s0)
        c.out.fill_(float("nan"))
        o64, st64 = c.ref64(acc=torch.ones_like(c.num_acc))
        assert c.decode() is c.out
        assert rel(c.out, o64) <= 4e-3
        assert rel(c.state[written], st64[written]) <= _state_tol(state_dtype)


def test_cuda_op_loaded_or_said_why():
    if OP is None:
        pytest.skip(f"vLLM's CUDA op not loadable ({LIB} missing or not loadable): comparisons against it skipped")
    assert callable(OP)


@KERNELS
@pytest.mark.parametrize("state_dtype", [torch.float32, BF])
def test_graph_replay_with_new_lengths_slots_and_counts(state_dtype, kernel):
    n, t = 6, 4
    c = Cell(n, t, state_dtype, seed=5)
    c.mtp()  # compile and plan outside the capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        c.mtp()
    gen = torch.Generator(device=DEV).manual_seed(99)
    for step in range(3):
        lens = torch.tensor([4, 0, 2, 1, 3, 4][step:] + [4, 0, 2, 1, 3, 4][:step], device=DEV)
        c.cu.copy_(torch.cat([torch.zeros(1, device=DEV, dtype=torch.int64), lens.cumsum(0)]).to(torch.int32))
        c.idx.copy_((torch.randperm(c.state.shape[0] - 3, generator=gen, device=DEV)[: n * t] + 3).view(n, t))
        c.idx[(step + 2) % n] = -1  # a padded request
        c.num_acc.copy_(torch.clamp(torch.randint(1, t + 1, (n,), generator=gen, device=DEV), max=t))
        c.qkvz.copy_(torch.randn(c.qkvz.shape, generator=gen, device=DEV).to(BF))
        c.ba.copy_(torch.randn(c.ba.shape, generator=gen, device=DEV).to(BF))
        c.out.fill_(float("nan"))
        st64 = c.state.double()
        o64 = reference.post_conv_mtp(c.mixed, c.a, c.b, c.A_log, c.dt_bias, c.idx, c.cu, c.num_acc, st64, c.gate,
                                      c.w, K**-0.5, 1e-6, "silu", dtype=torch.float64)
        g.replay()
        torch.cuda.synchronize()
        real = int(c.cu[-1])
        assert rel(c.out[:real], o64[:real]) <= 4e-3
        pad_req = (step + 2) % n
        lo, hi = int(c.cu[pad_req]), int(c.cu[pad_req + 1])
        assert (c.out[lo:hi] == 0).all()
        written = sorted({int(c.idx[r, j]) for r in range(n) for j in range(int(lens[r])) if int(c.idx[r, j]) > 0})
        assert rel(c.state[written], st64[written]) <= _state_tol(state_dtype)


@KERNELS
@pytest.mark.parametrize("state_dtype", [torch.float32, BF])
def test_decode_graph_replay_with_new_slots(state_dtype, kernel):
    n = 16
    c = Cell(n, 1, state_dtype, seed=7)
    idx = c.idx[:, 0].contiguous()

    def step():
        return vllm_entry.try_packed_decode_norm(c.mixed, c.a, c.b, c.A_log, c.dt_bias, K**-0.5, c.state, c.out,
                                                 idx, c.gate, c.w, 1e-6, "silu")

    step()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        step()
    gen = torch.Generator(device=DEV).manual_seed(3)
    for _ in range(2):
        idx.copy_(torch.randperm(c.state.shape[0] - 3, generator=gen, device=DEV)[:n] + 3)
        idx[3], idx[9] = -1, 0
        c.qkvz.copy_(torch.randn(c.qkvz.shape, generator=gen, device=DEV).to(BF))
        st64 = c.state.double()
        tok = n
        o = reference.step(c.mixed[:, : H * K].reshape(tok, H, K), c.mixed[:, H * K: 2 * H * K].reshape(tok, H, K),
                           c.mixed[:, 2 * H * K:].reshape(tok, HV, V), c.a, c.b, c.A_log, c.dt_bias, st64, idx,
                           dtype=torch.float64)
        o64 = reference.gated_rmsnorm(o, c.gate, c.w, 1e-6, "silu", dtype=torch.float64)
        g.replay()
        torch.cuda.synchronize()
        valid = idx > 0
        assert rel(c.out[valid], o64[valid]) <= 4e-3 and (c.out[~valid] == 0).all()
        w = [int(s) for s in idx.tolist() if s > 0]
        assert rel(c.state[w], st64[w]) <= _state_tol(state_dtype)


# ----------------------------------------------------------------------------- the state tile in shared memory


def _ragged(c, gen, step=0):
    """Ragged lengths in [0, T] (one request empty), one request padded (index row -1), one with a 0 slot as
    its initial state, new accepted counts, inputs and slots: written into the cell's buffers."""
    n, t = c.n, c.t
    lens = torch.randint(1, t + 1, (n,), generator=gen, device=DEV) if t > 1 else torch.ones(n, device=DEV,
                                                                                              dtype=torch.int64)
    if n > 2 and t > 1:
        lens[(step + 1) % n] = 0
    c.cu.copy_(torch.cat([torch.zeros(1, device=DEV, dtype=torch.int64), lens.cumsum(0)]).to(torch.int32))
    c.idx.copy_((torch.randperm(c.state.shape[0] - 3, generator=gen, device=DEV)[: n * t] + 3).view(n, t))
    c.num_acc.copy_(torch.randint(1, t + 1, (n,), generator=gen, device=DEV))
    if n > 1:
        c.idx[step % n] = -1
    if n > 3:
        c.idx[(step + 3) % n, int(c.num_acc[(step + 3) % n]) - 1] = 0
    c.qkvz.copy_(torch.randn(c.qkvz.shape, generator=gen, device=DEV).to(BF))
    c.ba.copy_(torch.randn(c.ba.shape, generator=gen, device=DEV).to(BF))


def _direct(c, cfg):
    """The CUDA step at launch shape ``cfg`` on the cell's buffers (T = 1: the packed decode of column 0)."""
    spec = c.t > 1
    idx = c.idx if spec else c.idx[:, 0]
    step = cuda_step.CudaStep(c.mixed, c.a, c.b, c.A_log, c.dt_bias, c.out, c.state, idx, c.gate, c.w, n_req=c.n,
                              spec=spec, scale=K**-0.5, norm_eps=1e-6, sigmoid_gate=False,
                              acc=c.num_acc if spec else None, cu=c.cu if spec else None, cfg=cfg)

    def run():
        assert step(c.mixed, c.a, c.b, c.A_log, c.dt_bias, c.out, c.state, idx, c.gate, c.w,
                    c.num_acc if spec else None, c.cu if spec else None)
        return c.out

    return step, run


def _bits(x):
    return x.view(torch.int16 if x.element_size() == 2 else torch.int32)


def _sm90():
    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("the CUDA step's shared-tile shapes (cp.async.bulk, mbarriers) need an sm_90+ GPU")


@pytest.mark.parametrize("label", cuda_step.TWIN_SHAPES)
@pytest.mark.parametrize("state_dtype", [torch.float32, BF])
@pytest.mark.parametrize("n,t", [(1, 2), (8, 1), (33, 4), (256, 3), (64, 8), (300, 1)])
def test_shared_tile_shapes_equal_their_register_twin_bitwise(label, state_dtype, n, t):
    """A shape with the tile in shared memory (suffix ``b``), with the short load chain (suffix ``c``), with the
    norm's sums sent by st.async (suffix ``a``) or with the row sums by a reduce-scatter (suffix ``x``) gives bit for bit the outputs and every state of the register-tile
    shape with the same rows and lanes per thread (same operations, same order), with padding, an empty request
    and a 0 initial slot in the batch; and float64's values within the usual tolerances."""
    _sm90()
    cfg = cuda_step.CudaConfig.parse(label)
    twin = cfg.register_twin()
    assert (cfg.bulk or cfg.chain or cfg.norm_async or cfg.scatter) and not (
        twin.bulk or twin.chain or twin.norm_async or twin.guess or twin.scatter)
    c = Cell(n, t, state_dtype, seed=n + 7 * t)
    _ragged(c, torch.Generator(device=DEV).manual_seed(n * t))
    s0 = c.state.clone()
    step, run = _direct(c, cfg)
    assert step.grid == n * HV * (V // cfg.block_v)
    c.out.fill_(float("nan"))
    o_smem, st_smem = run().clone(), c.state.clone()
    c.state.copy_(s0)
    c.out.fill_(float("nan"))
    o_reg, st_reg = _direct(c, twin)[1]().clone(), c.state.clone()
    assert torch.equal(_bits(o_smem), _bits(o_reg)), (label, "outputs")
    assert torch.equal(_bits(st_smem), _bits(st_reg)), (label, "states")
    st64 = s0.double()
    if t > 1:
        o64 = reference.post_conv_mtp(c.mixed, c.a, c.b, c.A_log, c.dt_bias, c.idx, c.cu, c.num_acc, st64, c.gate,
                                      c.w, K**-0.5, 1e-6, "silu", dtype=torch.float64)
        real = int(c.cu[-1])
        pad = [r for r in range(n) if int(c.idx[r, int(c.num_acc[r]) - 1]) <= 0]
        keep = torch.ones(real, dtype=torch.bool, device=DEV)
        for r in pad:
            keep[int(c.cu[r]):int(c.cu[r + 1])] = False
            assert (o_smem[int(c.cu[r]):int(c.cu[r + 1])] == 0).all()
        assert rel(o_smem[:real][keep], o64[:real][keep]) <= 4e-3
        lens = (c.cu[1:] - c.cu[:-1]).tolist()
        written = sorted({int(c.idx[r, j]) for r in range(n) if r not in pad for j in range(int(lens[r]))
                          if int(c.idx[r, j]) > 0})
    else:
        idx = c.idx[:, 0]
        o = reference.step(c.mixed[:, : H * K].reshape(n, H, K), c.mixed[:, H * K: 2 * H * K].reshape(n, H, K),
                           c.mixed[:, 2 * H * K:].reshape(n, HV, V), c.a, c.b, c.A_log, c.dt_bias, st64, idx,
                           dtype=torch.float64)
        o64 = reference.gated_rmsnorm(o, c.gate, c.w, 1e-6, "silu", dtype=torch.float64)
        valid = idx > 0
        assert rel(o_smem[valid], o64[valid]) <= 4e-3 and (o_smem[~valid] == 0).all()
        written = [int(s) for s in idx.tolist() if s > 0]
    assert rel(st_smem[written], st64[written]) <= _state_tol(state_dtype)


@pytest.mark.parametrize("label", cuda_step.CHAIN_SHAPES + cuda_step.CHAIN_TILE_SHAPES)
@pytest.mark.parametrize("state_dtype", [torch.float32, BF])
@pytest.mark.parametrize("t", [2, 8])
def test_chain_shapes_take_num_accepted_out_of_range_as_padding(label, state_dtype, t):
    """The short chain takes the initial slot from the lane holding index column num_accepted - 1: a count of 0
    or above the columns is padding (zero outputs, no state written), as in the register twin without ``c``
    (or ``cb``); int64 index tensors; bit for bit the twin's outputs and states."""
    _sm90()
    cfg, twin = cuda_step.CudaConfig.parse(label), cuda_step.CudaConfig.parse(label.rstrip("cb"))
    n = 9
    c = Cell(n, t, state_dtype, seed=3 + t)
    _ragged(c, torch.Generator(device=DEV).manual_seed(t))
    c.num_acc[2], c.num_acc[5] = 0, t + 1
    c.idx, c.num_acc, c.cu = c.idx.long(), c.num_acc.long(), c.cu.long()
    s0 = c.state.clone()
    c.out.fill_(float("nan"))
    o, st = _direct(c, cfg)[1]().clone(), c.state.clone()
    c.state.copy_(s0)
    c.out.fill_(float("nan"))
    o_twin, st_twin = _direct(c, twin)[1]().clone(), c.state.clone()
    assert torch.equal(_bits(o), _bits(o_twin)) and torch.equal(_bits(st), _bits(st_twin)), label
    for r in (2, 5):
        assert (o[int(c.cu[r]):int(c.cu[r + 1])] == 0).all()
        assert torch.equal(st[c.idx[r]], s0[c.idx[r]])
    assert not torch.equal(_bits(st), _bits(s0))


@pytest.mark.parametrize("label", ["128x8x2t256m4b", "128x16x4t512m2b", "128x8x4t256m2c", "64x8x4t128m4c",
                                   "128x8x2t256m4cb", "128x16x4t512m2cb", "64x8x4t128m4ca", "64x8x4t128m4cagx",
                                   "128x16x4t512m2cbx", "128x8x2t256m4bx"])
@pytest.mark.parametrize("state_dtype", [torch.float32, BF])
@pytest.mark.parametrize("t", [1, 4])
def test_shared_tile_shapes_replay_in_a_graph(label, state_dtype, t):
    """Captured once, replayed after new lengths, slots, padding, accepted counts and inputs: bit for bit what
    the register-tile twin computes eagerly from the same pool (nothing compiled inside the capture)."""
    _sm90()
    cfg = cuda_step.CudaConfig.parse(label)
    twin = cfg.register_twin()
    n = 40
    c = Cell(n, t, state_dtype, seed=11 + t)
    _, run = _direct(c, cfg)
    _, run_twin = _direct(c, twin)
    run()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        run()
    gen = torch.Generator(device=DEV).manual_seed(5)
    for step in range(3):
        _ragged(c, gen, step)
        s0 = c.state.clone()
        c.out.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        o_g, st_g = c.out.clone(), c.state.clone()
        c.state.copy_(s0)
        c.out.fill_(float("nan"))
        run_twin()
        torch.cuda.synchronize()
        assert torch.equal(_bits(o_g), _bits(c.out)) and torch.equal(_bits(st_g), _bits(c.state)), (label, step)
        assert not torch.equal(_bits(st_g), _bits(s0))  # (the replay did write states)


# ----------------------------------------------------------------------------- routing and the canary, on the GPU


def test_canary_passes_for_both_entries_on_this_gpu():
    kernels = ("triton", "cuda") if torch.cuda.get_device_capability() >= (9, 0) else ("triton",)
    for kernel in kernels:
        for state_dtype in (torch.float32, BF):
            for t, decode in ((1, True), (4, False), (8, False)):
                err, tol = canary.step_check(H, HV, K, V, state_dtype, t, decode, "cuda", kernel)
                assert err <= tol / 4, (kernel, state_dtype, t, decode, err)


def _cells(state_dtype, mode, win):
    """(batch, T) measured cells of the routing table that sndr won (``win``) or lost, T >= 2."""
    wins = routing.WINS[(str(state_dtype).replace("torch.", ""), mode)]
    return [(b, t) for t in routing.TS if t >= 2 for b in routing.BATCHES if (b in wins.get(t, ())) == win]


@pytest.mark.routed
@pytest.mark.parametrize("state_dtype", [torch.float32, BF])
def test_entries_take_exactly_the_winning_cells(state_dtype, monkeypatch):
    """Eager calls of the MTP entry on the H200: a cell the committed benchmark lost returns None (vLLM's op
    runs), a won cell runs sndr (after its canary passed); where only the graph cell won, the layout's first
    eager call (vLLM's warm-up) runs sndr once and later ones keep vLLM's path; a capture follows the graph
    table."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the routing table's default scope is sm_90")
    monkeypatch.setattr(vllm_entry, "_SCOPE", {"explicit": False})
    monkeypatch.setattr(vllm_entry, "_CELLS", {})
    lost, won = _cells(state_dtype, "eager", False), _cells(state_dtype, "eager", True)
    graph_won = set(_cells(state_dtype, "graph", True))
    both_lost = [c for c in lost if c not in graph_won]
    warm_up = [c for c in lost if c in graph_won]  # vLLM warms a graph size up eagerly before it captures it
    dt = str(state_dtype).replace("torch.", "")
    cuda_won = [c for c in won if routing.kernel_for(dt, "eager", *c) == "cuda"]
    triton_won = [c for c in won if c not in cuda_won]
    for (b, t), want in [(c, False) for c in both_lost[:2]] + [(c, True) for c in cuda_won[:2] + triton_won[:2]]:
        c = Cell(b, t, state_dtype, seed=b + t)
        launches = cuda_step.STATS["launches"]
        res = c.mtp()
        assert (res is c.out) == want, (b, t, want)
        # a won cell runs the step the routing table names for it (routing.CUDA), and no other
        want_cuda = want and routing.kernel_for(dt, "eager", b, t) == "cuda"
        assert (cuda_step.STATS["launches"] > launches) == want_cuda, (b, t, "CUDA step" if want_cuda else "Triton")
    for b, t in warm_up[:2]:  # the first eager call of the layout runs sndr once (compiled, canary passed)
        c = Cell(b, t, state_dtype, seed=b + t)
        assert c.mtp() is c.out, (b, t, "warm-up")
        assert c.mtp() is None, (b, t, "after the warm-up, eager calls keep vLLM's path")
    glost = _cells(state_dtype, "graph", False)
    if glost:
        b, t = glost[0]
        c = Cell(b, t, state_dtype, seed=3)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            assert c.mtp() is None
