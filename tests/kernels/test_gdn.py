"""GDN decode / spec-verify kernel (sndr.kernels.gdn) on the CPU through Triton's interpreter.

Against the naive fp32 recurrence (``reference.step``): shapes of the 35B-A3B
layer scaled down (H = 2 key heads, HV = 4 value heads, K = 32, V = 64, so
the value rows split over 2-8 programs), T in {1, 2, 4}, padding rows (slot
-1 and the NULL slot 0), float32 and bfloat16 state pools, a pool that is a
strided view of a larger buffer, a sequence that reads and overwrites the
same slot, and accepted-token counts below T.

Tolerance, stated: with float32 activations and a float32 pool, the relative
Frobenius error of the outputs and of every written state is at most 1e-5
(float32 arithmetic in another order). Where a result is stored as bf16 (bf16
activations give bf16 outputs; a bf16 pool) every element is within one bf16
ulp of the reference's value: Triton's interpreter converts float32 to bf16
by truncation, torch rounds to nearest (the GPU rounds to nearest, and
test_gdn_gpu.py holds bf16 results to FLA's 2e-3). Slots the step must not
touch are compared bit for bit.

Also: the vLLM-signature drop-ins refuse what they do not take (logged once),
and PK0003's wrappers keep vLLM's signature, call sndr's kernel where it
takes the call and vLLM's original otherwise.
"""

from __future__ import annotations

import logging
import tomllib
import types
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="torch not installed (install the [kernels] extra)")
pytest.importorskip("triton", reason="triton unavailable (install the [kernels] extra)")

from sndr.binding import signature_of_callable  # noqa: E402
from sndr.kernels.gdn import kernels, reference, vllm_entry  # noqa: E402
from sndr.runtime_patches import gdn as rp_gdn  # noqa: E402

pytestmark = pytest.mark.cpu_interpreter  # tests/kernels/conftest.py: interpreter only, its fix applied

REPO = Path(__file__).resolve().parents[2]
PATCH = REPO / "patches" / "PK0003-gdn-decode-kernels.toml"
H, HV, K, V = 2, 4, 32, 64
BF = torch.bfloat16


def rel(a, b):
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def close(x, ref, *dtypes):
    """float32 everywhere: relative error <= 1e-5; a bf16 result: each element within one bf16 ulp."""
    if all(d == torch.float32 for d in dtypes):
        return rel(x, ref) <= 1e-5
    x, ref = x.double(), ref.double()
    mag = ref.abs().clamp_min(1e-30)
    ulp = torch.exp2(torch.floor(torch.log2(mag)) - 7)
    return bool(((x - ref).abs() <= ulp * 1.001 + 1e-6 * ref.abs().max()).all()) and rel(x, ref) <= 8e-3


class Problem:
    """N sequences x T tokens with their own snapshot slots in a shuffled pool."""

    def __init__(self, n, t, state_dtype, seed=0, pad=(), pool_pad=0, h=H, hv=HV, k=K, v=V, varlen=True,
                 act=torch.float32):
        g = torch.Generator().manual_seed(seed)
        self.n, self.t, self.h, self.hv, self.k, self.v = n, t, h, hv, k, v
        tok = n * t
        slots = n * t + 3
        full = torch.randn(slots, hv * v * k + pool_pad, generator=g) * 0.3
        # a pool row may be longer than HV*V*K (vLLM packs conv + ssm state in one page)
        self.state = full[:, : hv * v * k].view(slots, hv, v, k).to(state_dtype) if state_dtype != torch.float32 \
            else full.as_strided((slots, hv, v, k), (hv * v * k + pool_pad, v * k, k, 1))
        self.pool_pad = pool_pad
        perm = torch.randperm(slots - 3, generator=g) + 3  # slots 1, 2 stay unused
        self.idx = perm.reshape(n, t).to(torch.int32)
        for i in pad:
            self.idx[i] = -1 if i % 2 == 0 else 0
        self.num_acc = torch.randint(1, t + 1, (n,), generator=g, dtype=torch.int32)
        self.cu = torch.arange(0, tok + 1, t, dtype=torch.int32) if varlen else None
        self.act = act
        self.q = torch.randn(1 if varlen else n, tok if varlen else t, h, k, generator=g).to(act)
        self.kk = torch.randn(self.q.shape, generator=g).to(act)
        self.vv = torch.randn(*self.q.shape[:2], hv, v, generator=g).to(act)
        self.a = torch.randn(tok, hv, generator=g).to(act)
        self.b = torch.randn(tok, hv, generator=g).to(act)
        self.A_log = torch.rand(hv, generator=g) * 2 - 1
        self.dt_bias = torch.rand(hv, generator=g) * 2 - 1

    def ref(self, spec=True):
        st = self.state.clone()
        tok = self.n * self.t
        idx = self.idx if self.t > 1 or spec else self.idx[:, 0]
        o = reference.step(self.q.reshape(tok, self.h, self.k), self.kk.reshape(tok, self.h, self.k),
                           self.vv.reshape(tok, self.hv, self.v), self.a, self.b, self.A_log, self.dt_bias, st,
                           idx, cu_seqlens=self.cu, num_accepted_tokens=self.num_acc if spec else None)
        return o, st

    def sndr(self, spec=True):
        idx = self.idx if self.t > 1 or spec else self.idx[:, 0].contiguous()
        o, st = vllm_entry.try_sigmoid_gating_update(
            A_log=self.A_log, a=self.a, b=self.b, dt_bias=self.dt_bias, q=self.q, k=self.kk, v=self.vv,
            initial_state=self.state, inplace_final_state=True, cu_seqlens=self.cu, ssm_state_indices=idx,
            num_accepted_tokens=self.num_acc if spec else None, use_qk_l2norm_in_kernel=True)
        assert st is self.state
        return o.reshape(self.n * self.t, self.hv, self.v), st


def _written(p, spec=True):
    """Slots the step writes (every valid column t of every valid row)."""
    idx = p.idx if p.t > 1 or spec else p.idx[:, :1]
    return sorted({int(s) for s in idx.reshape(-1).tolist() if s > 0})


def _compare(p, spec=True):
    before = p.state.clone()
    o_ref, st_ref = p.ref(spec)
    o, st = p.sndr(spec)
    valid_tok = torch.repeat_interleave(p.idx[:, 0] > 0 if not spec else
                                        p.idx.gather(1, (p.num_acc.long() - 1).clamp_min(0)[:, None])[:, 0] > 0,
                                        p.t)
    assert torch.isfinite(o).all()
    assert close(o[valid_tok], o_ref[valid_tok], p.state.dtype, p.act)
    assert (o[~valid_tok] == 0).all(), "padded rows are zero"
    written = _written(p, spec)
    if written:
        assert close(st[written], st_ref[written], p.state.dtype)
    untouched = [s for s in range(p.state.shape[0]) if s not in written]
    assert torch.equal(st[untouched], before[untouched]), "slots outside the index are untouched"
    return o, st


@pytest.mark.parametrize("act", [torch.float32, BF])
@pytest.mark.parametrize("state_dtype", [torch.float32, BF])
@pytest.mark.parametrize("t", [1, 2, 4])
def test_spec_verify_matches_reference(t, state_dtype, act):
    p = Problem(3, t, state_dtype, seed=t, pad=(1,), act=act)
    if t > 1:
        p.num_acc[0] = t - 1  # accepted below T: starts from an earlier snapshot
    _compare(p, spec=True)


@pytest.mark.parametrize("act", [torch.float32, BF])
@pytest.mark.parametrize("state_dtype", [torch.float32, BF])
def test_packed_decode_matches_reference(state_dtype, act):
    p = Problem(5, 1, state_dtype, seed=11, pad=(0, 3), act=act)
    before = p.state.clone()
    o_ref, st_ref = p.ref(spec=False)
    tok, hk = p.n, p.h * p.k
    mixed = torch.cat([p.q.reshape(tok, hk), p.kk.reshape(tok, hk), p.vv.reshape(tok, p.hv * p.v)], 1)
    # a token stride wider than the packed width (vLLM slices mixed_qkv out of a larger buffer)
    wide = torch.zeros(tok, mixed.shape[1] + 16, dtype=act)
    wide[:, : mixed.shape[1]] = mixed
    out = torch.full((tok, 1, p.hv, p.v), float("nan"), dtype=act)
    idx = p.idx[:, 0].contiguous()
    res = vllm_entry.try_packed_decode(wide[:, : mixed.shape[1]], p.a, p.b, p.A_log, p.dt_bias, p.k**-0.5,
                                       p.state, out, idx, True)
    assert res is not None and res[0] is out and res[1] is p.state
    valid = idx > 0
    assert close(out[valid, 0], o_ref[valid], state_dtype, act)
    assert (out[~valid] == 0).all()
    written = [int(s) for s in idx if s > 0]
    assert close(p.state[written], st_ref[written], state_dtype)
    untouched = [s for s in range(p.state.shape[0]) if s not in written]
    assert torch.equal(p.state[untouched], before[untouched])


@pytest.mark.parametrize("t", [1, 4])
def test_non_spec_sigmoid_path_and_fixed_t(t):
    """vLLM's non-spec decode through the sigmoid-gating entry (1-D index), and B x T without cu_seqlens."""
    p = Problem(3, 1, torch.float32, seed=5, pad=(2,))
    _compare(p, spec=False)
    p = Problem(2, t, torch.float32, seed=6, varlen=False)
    _compare(p, spec=True)


def test_state_pool_aliasing():
    """The pool is a strided view of a larger buffer; a sequence reads a slot it then overwrites."""
    p = Problem(3, 4, torch.float32, seed=21, pool_pad=96)
    assert p.state.stride(0) == p.hv * p.v * p.k + 96
    p.num_acc[:] = torch.tensor([2, 4, 1], dtype=torch.int32)  # row 0 reads column 1, then rewrites it
    spare = p.state.as_strided((p.state.shape[0], 96), (p.state.stride(0), 1), p.hv * p.v * p.k)
    spare_before = spare.clone()
    _compare(p, spec=True)
    assert torch.equal(spare, spare_before), "the bytes between pool rows are untouched"


@pytest.mark.parametrize("bv,warps", [(8, 1), (16, 2), (32, 4), (64, 2)])
def test_launch_shapes_agree(bv, warps):
    p = Problem(2, 2, torch.float32, seed=31)
    o_ref, st_ref = p.ref()
    tok = p.n * p.t
    o = torch.empty(tok, p.hv, p.v)
    kernels.gdn_step(p.q.reshape(tok, p.h, p.k), p.kk.reshape(tok, p.h, p.k), p.vv.reshape(tok, p.hv, p.v),
                     p.a, p.b, p.A_log, p.dt_bias, p.state, p.idx, o, scale=p.k**-0.5, n_seqs=p.n,
                     cu_seqlens=p.cu, num_accepted_tokens=p.num_acc, idx_tok_stride=1,
                     config=kernels.StepConfig(bv, warps))
    assert rel(o, o_ref) <= 1e-5
    w = _written(p)
    assert rel(p.state[w], st_ref[w]) <= 1e-5


def test_unpadded_head_dims():
    """K and V that are not powers of two (masked tiles)."""
    p = Problem(2, 2, torch.float32, seed=41, h=1, hv=3, k=24, v=40)
    _compare(p, spec=True)


def test_softplus_beta_threshold_and_no_l2norm():
    p = Problem(2, 2, torch.float32, seed=51)
    tok = p.n * p.t
    st_ref = p.state.clone()
    o_ref = reference.step(p.q.reshape(tok, p.h, p.k), p.kk.reshape(tok, p.h, p.k), p.vv.reshape(tok, p.hv, p.v),
                           p.a, p.b, p.A_log, p.dt_bias, st_ref, p.idx, cu_seqlens=p.cu,
                           num_accepted_tokens=p.num_acc, l2norm=False, sp_beta=2.0, threshold=0.5, scale=0.3)
    o, st = vllm_entry.try_sigmoid_gating_update(
        p.A_log, p.a, p.b, p.dt_bias, p.q, p.kk, p.vv, 2.0, 0.5, 0.3, p.state, True, p.cu, p.idx, p.num_acc,
        False, False)
    assert rel(o.reshape(tok, p.hv, p.v), o_ref) <= 1e-5
    w = _written(p)
    assert rel(st[w], st_ref[w]) <= 1e-5


def test_reference_matches_textbook_recurrence():
    """reference.step against an independent float64 loop of S <- exp(g) S; u = b(v - Sk); S += u k^T; o = S q."""
    p = Problem(1, 3, torch.float32, seed=61)
    p.num_acc[0] = 1
    o, st = p.ref()
    q = p.q[0].double()
    kk = p.kk[0].double()
    q = q / torch.sqrt((q * q).sum(-1, keepdim=True) + 1e-6) * p.k**-0.5
    kk = kk / torch.sqrt((kk * kk).sum(-1, keepdim=True) + 1e-6)
    S = p.state[int(p.idx[0, 0])].double()
    for t in range(3):
        x = p.a[t].double() + p.dt_bias.double()
        g = -torch.exp(p.A_log.double()) * torch.nn.functional.softplus(x)
        beta = torch.sigmoid(p.b[t].double())
        for hv in range(p.hv):
            h = hv // (p.hv // p.h)
            S[hv] = S[hv] * torch.exp(g[hv])
            u = beta[hv] * (p.vv[0, t, hv].double() - S[hv] @ kk[t, h])
            S[hv] = S[hv] + torch.outer(u, kk[t, h])
            assert rel(o[t, hv], S[hv] @ q[t, h]) <= 1e-5
        assert rel(st[int(p.idx[0, t])], S) <= 1e-5


# ----------------------------------------------------------------------------- fall-through and PK0003


def test_drop_ins_refuse_what_they_do_not_take(caplog):
    p = Problem(2, 2, torch.float32, seed=71)
    kw = dict(A_log=p.A_log, a=p.a, b=p.b, dt_bias=p.dt_bias, q=p.q, k=p.kk, v=p.vv, cu_seqlens=p.cu,
              ssm_state_indices=p.idx, num_accepted_tokens=p.num_acc, use_qk_l2norm_in_kernel=True)
    half = p.state.to(torch.float16)
    vllm_entry._LOGGED.clear()
    with caplog.at_level(logging.WARNING, logger="sndr.kernels"):
        assert vllm_entry.try_sigmoid_gating_update(initial_state=half, **kw) is None
        assert vllm_entry.try_sigmoid_gating_update(initial_state=half, **kw) is None
        assert vllm_entry.try_sigmoid_gating_update(initial_state=p.state, is_kda=True, **kw) is None
        assert vllm_entry.try_sigmoid_gating_update(initial_state=p.state, inplace_final_state=False, **kw) is None
    msgs = [r.getMessage() for r in caplog.records]
    assert sum("torch.float16" in m for m in msgs) == 1, msgs  # once per reason
    assert any("KDA" in m for m in msgs) and any("inplace_final_state" in m for m in msgs)
    assert all("falls through to vLLM" in m for m in msgs)


def _patch():
    return tomllib.loads(PATCH.read_text())


def test_patch_declares_the_wrappers_with_vllm_signatures():
    data = _patch()
    assert data["id"] == "PK0003" and data["default"] is True and data["lifecycle"] == "active"
    by = {r["name"]: r for r in data["runtime"]}
    assert set(by) == {"packed-decode", "sigmoid-gating-update", "post-conv-mtp", "decode-fused-norm",
                       "plain-decode-routing"}
    for r in by.values():
        assert r["wrap"] and r["target"].startswith(("vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn:",
                                                     "vllm._custom_ops:fused_gdn_decode_post_conv_mtp"))
        mod, fn = r["replacement"].split(":")
        assert mod == "sndr.runtime_patches.gdn"
        wrapper = getattr(rp_gdn, fn)(lambda *a, **k: None)
        # the wrapper's own parameter list (not only through __wrapped__) is vLLM's
        bare = types.FunctionType(wrapper.__code__, wrapper.__globals__, None, wrapper.__defaults__,
                                  wrapper.__closure__)
        own = signature_of_callable(bare)
        assert signature_of_callable(wrapper) == signature_of_callable(wrapper.__wrapped__)
        assert own == r["signature"], (own, r["signature"])


def test_wrappers_route_to_sndr_or_vllm():
    calls = []

    def original(*args, **kwargs):
        calls.append((args, kwargs))
        return "vllm"

    p = Problem(2, 2, torch.float32, seed=81)
    w = rp_gdn.wrap_sigmoid_gating_update(original)
    o, st = w(A_log=p.A_log, a=p.a, b=p.b, dt_bias=p.dt_bias, q=p.q, k=p.kk, v=p.vv, initial_state=p.state,
              inplace_final_state=True, cu_seqlens=p.cu, ssm_state_indices=p.idx,
              num_accepted_tokens=p.num_acc, use_qk_l2norm_in_kernel=True)
    assert not calls and st is p.state and o.shape == (1, 4, p.hv, p.v)
    assert w(A_log=p.A_log, a=p.a, b=p.b, dt_bias=p.dt_bias, q=p.q, k=p.kk, v=p.vv, initial_state=p.state,
             is_kda=True, ssm_state_indices=p.idx) == "vllm"
    assert calls[-1][1]["is_kda"] is True and calls[-1][1]["initial_state"] is p.state

    wp = rp_gdn.wrap_packed_decode(original)
    n = 2
    mixed = torch.randn(n, 2 * p.h * p.k + p.hv * p.v).to(BF)
    out = torch.empty(n, 1, p.hv, p.v, dtype=BF)
    idx = torch.tensor([3, 4], dtype=torch.int32)
    r = wp(mixed, p.a[:n], p.b[:n], p.A_log, p.dt_bias, 0.2, p.state, out, idx, use_qk_l2norm_in_kernel=True)
    assert r[0] is out and len(calls) == 1
    r = wp(mixed, p.a[:n], p.b[:n], p.A_log, p.dt_bias, 0.2, p.state.to(torch.float16), out, idx, True)
    assert r == "vllm" and calls[-1][1] == {"use_qk_l2norm_in_kernel": True}
    assert wp.__wrapped__ is original and wp.__sndr_wraps__ is original
