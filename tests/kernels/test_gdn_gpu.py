"""The GDN step compiled on a GPU, against the float64 naive recurrence.

Skipped without CUDA. Run on the H200 through the device tool:

    python3 -m pytest tests/kernels/test_gdn_gpu.py -q

The 35B-A3B head shape (16 key heads, 32 value heads, K = V = 128); batches
that select each launch shape of the heuristic; T in {1, 2, 4} with
accepted-token counts below T; padding rows; float32 and bfloat16 pools;
outputs poisoned with NaN before each call. Tolerance, FLA's: relative
Frobenius error <= 2e-3 for outputs and written states (bf16 activations give
bf16 outputs, rounded to nearest: about 1e-3); 1e-5 with float32 activations
and a float32 pool. Graph capture and replay: a step captured once replays
correctly on new inputs, new indices and new accepted counts written into the
captured buffers.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 0):
    pytest.skip("needs a CUDA GPU with sm_80+", allow_module_level=True)

from sndr.kernels.gdn import kernels, reference, routing, vllm_entry  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _every_cell():
    """vLLM's Triton fallback entries run only with SNDR_ENABLE_PK0003=1 on a GPU; these tests check them in
    every cell (``routing.measuring``)."""
    with routing.measuring():
        yield


DEV = "cuda"
H, HV, K, V = 16, 32, 128, 128
BF = torch.bfloat16


def rel(a, b):
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def tol(*dtypes):
    return 1e-5 if all(d == torch.float32 for d in dtypes) else 2e-3


class Case:
    def __init__(self, n, t, state_dtype, act=BF, seed=0, pad=()):
        g = torch.Generator(device=DEV).manual_seed(seed)
        self.n, self.t, self.act = n, t, act
        tok = n * t
        slots = tok + 3
        self.state = (torch.randn(slots, HV, V, K, generator=g, device=DEV) * 0.3).to(state_dtype)
        perm = torch.randperm(slots - 3, generator=g, device=DEV) + 3
        self.idx = perm.reshape(n, t).to(torch.int32)
        for i in pad:
            self.idx[i] = -1 if i % 2 == 0 else 0
        self.num_acc = torch.randint(1, t + 1, (n,), generator=g, device=DEV, dtype=torch.int32)
        self.cu = torch.arange(0, tok + 1, t, device=DEV, dtype=torch.int32)
        mk = lambda *s: torch.randn(*s, generator=g, device=DEV).to(act)  # noqa: E731
        self.q, self.k, self.v = mk(1, tok, H, K), mk(1, tok, H, K), mk(1, tok, HV, V)
        self.a, self.b = mk(tok, HV), mk(tok, HV)
        self.A_log = torch.rand(HV, generator=g, device=DEV) * 2 - 1
        self.dt_bias = torch.rand(HV, generator=g, device=DEV) * 2 - 1

    def spec_kw(self):
        spec = self.t > 1
        return dict(A_log=self.A_log, a=self.a, b=self.b, dt_bias=self.dt_bias, q=self.q, k=self.k, v=self.v,
                    initial_state=self.state, inplace_final_state=True, cu_seqlens=self.cu,
                    ssm_state_indices=self.idx if spec else self.idx[:, 0].contiguous(),
                    num_accepted_tokens=self.num_acc if spec else None, use_qk_l2norm_in_kernel=True)

    def ref64(self, spec=True):
        st = self.state.double()
        tok = self.n * self.t
        o = reference.step(self.q.reshape(tok, H, K), self.k.reshape(tok, H, K), self.v.reshape(tok, HV, V),
                           self.a, self.b, self.A_log, self.dt_bias, st,
                           self.idx if self.t > 1 else self.idx[:, 0], cu_seqlens=self.cu,
                           num_accepted_tokens=self.num_acc if spec and self.t > 1 else None,
                           dtype=torch.float64)
        return o, st

    def first_slot(self):
        if self.t == 1:
            return self.idx[:, 0]
        return self.idx.gather(1, (self.num_acc.long() - 1)[:, None])[:, 0]

    def written(self):
        return sorted({int(s) for s in self.idx.reshape(-1).tolist() if s > 0}
                      if self.t > 1 else {int(s) for s in self.idx[:, 0].tolist() if s > 0})

    def check(self, o, st_before, o_ref, st_ref):
        o = o.reshape(self.n * self.t, HV, V)
        valid = torch.repeat_interleave(self.first_slot() > 0, self.t)
        assert not torch.isnan(o).any(), "every output element written"
        assert rel(o[valid], o_ref[valid]) <= tol(self.state.dtype, self.act)
        assert (o[~valid] == 0).all()
        w = self.written()
        assert rel(self.state[w], st_ref[w]) <= tol(self.state.dtype)
        untouched = [s for s in range(self.state.shape[0]) if s not in w]
        assert torch.equal(self.state[untouched], st_before[untouched])


@pytest.mark.parametrize("state_dtype,act", [(torch.float32, BF), (BF, BF), (torch.float32, torch.float32)])
@pytest.mark.parametrize("t", [1, 2, 4])
@pytest.mark.parametrize("n", [1, 6, 9])
def test_spec_path_vs_float64(n, t, state_dtype, act):
    c = Case(n, t, state_dtype, act, seed=100 * n + t, pad=(1,) if n > 1 else ())
    if t > 1:
        c.num_acc[0] = t - 1
    o_ref, st_ref = c.ref64()
    before = c.state.clone()
    o, st = vllm_entry.try_sigmoid_gating_update(**c.spec_kw())
    torch.cuda.synchronize()
    assert st is c.state
    c.check(o, before, o_ref, st_ref)


@pytest.mark.parametrize("state_dtype,act", [(torch.float32, BF), (BF, BF), (torch.float32, torch.float32)])
@pytest.mark.parametrize("n", [1, 8, 40])
def test_packed_decode_vs_float64(n, state_dtype, act):
    c = Case(n, 1, state_dtype, act, seed=7 * n, pad=(2, 3) if n > 3 else ())
    o_ref, st_ref = c.ref64(spec=False)
    before = c.state.clone()
    mixed = torch.cat([c.q.reshape(n, -1), c.k.reshape(n, -1), c.v.reshape(n, -1)], 1)
    out = torch.full((n, 1, HV, V), float("nan"), device=DEV, dtype=act)
    r = vllm_entry.try_packed_decode(mixed, c.a, c.b, c.A_log, c.dt_bias, K**-0.5, c.state, out,
                                     c.idx[:, 0].contiguous(), True)
    torch.cuda.synchronize()
    assert r is not None and r[0] is out
    c.check(out, before, o_ref, st_ref)


@pytest.mark.parametrize("bv,warps", [(8, 1), (8, 2), (16, 2), (16, 4), (32, 1), (32, 4), (32, 8), (64, 4), (64, 8)])
def test_every_launch_shape(bv, warps):
    c = Case(3, 4, torch.float32, torch.float32, seed=5)
    o_ref, st_ref = c.ref64()
    before = c.state.clone()
    tok = 12
    o = torch.full((tok, HV, V), float("nan"), device=DEV)
    kernels.gdn_step(c.q.view(tok, H, K), c.k.view(tok, H, K), c.v.view(tok, HV, V), c.a, c.b, c.A_log,
                     c.dt_bias, c.state, c.idx, o, scale=K**-0.5, n_seqs=3, cu_seqlens=c.cu,
                     num_accepted_tokens=c.num_acc, idx_tok_stride=1, config=kernels.StepConfig(bv, warps))
    torch.cuda.synchronize()
    c.check(o, before, o_ref, st_ref)


@pytest.mark.parametrize("t", [1, 4])
def test_graph_capture_and_replay(t):
    n = 6
    c = Case(n, t, torch.float32, BF, seed=40 + t, pad=(3,))
    kw = c.spec_kw()
    vllm_entry.try_sigmoid_gating_update(**kw)  # compile outside the capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        with torch.cuda.graph(g):
            o_static, _ = vllm_entry.try_sigmoid_gating_update(**kw)
    torch.cuda.current_stream().wait_stream(s)
    for round_ in range(2):
        fresh = Case(n, t, torch.float32, BF, seed=1000 + round_, pad=(round_,))
        for name in ("q", "k", "v", "a", "b", "state", "idx", "num_acc"):
            getattr(c, name).copy_(getattr(fresh, name))
        o_static.fill_(float("nan"))
        o_ref, st_ref = c.ref64()
        before = c.state.clone()
        g.replay()
        torch.cuda.synchronize()
        c.check(o_static, before, o_ref, st_ref)


def test_packed_graph_capture_and_replay():
    n = 5
    c = Case(n, 1, BF, BF, seed=77)
    mixed = torch.cat([c.q.reshape(n, -1), c.k.reshape(n, -1), c.v.reshape(n, -1)], 1)
    idx = c.idx[:, 0].contiguous()
    out = torch.empty(n, 1, HV, V, device=DEV, dtype=BF)
    args = (mixed, c.a, c.b, c.A_log, c.dt_bias, K**-0.5, c.state, out, idx, True)
    vllm_entry.try_packed_decode(*args)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        vllm_entry.try_packed_decode(*args)
    fresh = Case(n, 1, BF, BF, seed=78, pad=(4,))
    for name in ("q", "k", "v", "a", "b", "state", "idx"):
        getattr(c, name).copy_(getattr(fresh, name))
    mixed.copy_(torch.cat([c.q.reshape(n, -1), c.k.reshape(n, -1), c.v.reshape(n, -1)], 1))
    idx.copy_(c.idx[:, 0])
    out.fill_(float("nan"))
    o_ref, st_ref = c.ref64(spec=False)
    before = c.state.clone()
    g.replay()
    torch.cuda.synchronize()
    c.check(out, before, o_ref, st_ref)


@pytest.mark.parametrize("fast", [True, False])
def test_repeated_calls_reuse_the_plan(fast, monkeypatch):
    """Same layout, fresh data each call: the cached plan (and the direct launch) stays correct,
    also when a tensor's alignment changes (a new specialisation compiles)."""
    monkeypatch.setattr(kernels, "FAST_LAUNCH", fast)
    before_fast = kernels.STATS["fast"]
    for round_ in range(4):
        c = Case(5, 4, torch.float32, BF, seed=500 + round_, pad=(2,))
        if round_ == 3:  # q 2 bytes off a 16-byte boundary: another specialisation
            buf = torch.empty(c.q.numel() + 1, device=DEV, dtype=BF)
            c.q = buf[1:].view(c.q.shape).copy_(c.q)
        o_ref, st_ref = c.ref64()
        before = c.state.clone()
        o, _ = vllm_entry.try_sigmoid_gating_update(**c.spec_kw())
        torch.cuda.synchronize()
        c.check(o, before, o_ref, st_ref)
        n = 5
        out = torch.full((n, 1, HV, V), float("nan"), device=DEV, dtype=BF)
        c1 = Case(n, 1, torch.float32, BF, seed=600 + round_)
        mixed = torch.cat([c1.q.reshape(n, -1), c1.k.reshape(n, -1), c1.v.reshape(n, -1)], 1)
        o_ref, st_ref = c1.ref64(spec=False)
        before = c1.state.clone()
        r = vllm_entry.try_packed_decode(mixed, c1.a, c1.b, c1.A_log, c1.dt_bias, K**-0.5, c1.state, out,
                                         c1.idx[:, 0].contiguous(), True)
        torch.cuda.synchronize()
        assert r is not None
        c1.check(out, before, o_ref, st_ref)
    if fast:
        assert kernels.STATS["fast"] > before_fast
    else:
        assert kernels.STATS["fast"] == before_fast
