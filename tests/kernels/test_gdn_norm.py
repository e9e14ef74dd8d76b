"""The GDN step with the gated RMSNorm fused, on the CPU through Triton's interpreter.

Two entries of PK0003 on vLLM 0.32.0's default path (VLLM_GDN_DECODE_KERNEL=cuda):

* ``vllm_entry.try_post_conv_mtp``: the call ``torch.ops._C.fused_gdn_decode_post_conv_mtp``
  gets (post-conv ``mixed_qkv``, ``a``, ``b``, ``state_indices [N, T]``, ``cu_seqlens``,
  ``num_accepted_tokens``, the pool, ``output_gate``, ``norm_weight``, ``out``);
* ``vllm_entry.try_packed_decode_norm``: the packed plain decode and the gated RMSNorm.

Against the float64 naive recurrence followed by vLLM's RMSNormGated (norm before gate,
group = V; ``reference.post_conv_mtp`` / ``reference.gated_rmsnorm``). Shapes of the
35B-A3B layer scaled down (H = 2, HV = 4, K = 32, V = 64), requests of different
lengths (including an empty one), padding slots (-1, 0), accepted counts 1..T and out
of range, both gate activations, bf16 and fp32 norm weights, ``a``/``b``/``output_gate``
as the strided views the layer passes. Tolerance, stated: every bf16 output element
within three bf16 ulps of the float64 value (the step's output is rounded to bf16 once before
the norm, as vLLM's unfused path stores it, and once after: see ``normed_close``; the
interpreter truncates float32 to bf16), every bf16 state element within one; with a float32 pool the written states within
relative 1e-5.
Slots the step must not touch are compared bit for bit.

Also: the routing of PK0003's three default-path wrappers (the op wrapper, the layer's
``_forward_core_fused_norm`` and ``__init__``), with vLLM's functions replaced by
recorders: what each takes, what it hands back to vLLM, and that a refused batch runs
nothing of sndr's.
"""

from __future__ import annotations

import logging
import types

import pytest

torch = pytest.importorskip("torch", reason="torch not installed (install the [kernels] extra)")
pytest.importorskip("triton", reason="triton unavailable (install the [kernels] extra)")

from sndr.kernels.gdn import kernels, reference, vllm_entry, vllm_layer  # noqa: E402
from sndr.runtime_patches import gdn as rp_gdn  # noqa: E402

pytestmark = pytest.mark.cpu_interpreter  # tests/kernels/conftest.py: interpreter only, its fix applied

H, HV, K, V = 2, 4, 32, 64
BF = torch.bfloat16
F64 = torch.float64


def rel(a, b):
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def within_ulp(x, ref, n=1):
    """Each element within ``n`` bf16 ulps of the float64 value (plus a floor for values near 0)."""
    x, ref = x.double(), ref.double()
    mag = ref.abs().clamp_min(1e-30)
    ulp = torch.exp2(torch.floor(torch.log2(mag)) - 7)
    return bool(((x - ref).abs() <= n * ulp * 1.001 + 1e-5 * ref.abs().max()).all())


def normed_close(x, ref):
    """A fused-norm output: the step's output is rounded to bf16 once before the norm (as vLLM's
    unfused path stores it) and once after. The first rounding's relative error (up to one ulp
    of the output) can be two ulps of the normed value where the two sit at opposite ends of
    their binades; with the second rounding, three bf16 ulps."""
    return within_ulp(x, ref, n=3) and rel(x, ref) <= 8e-3


class MTP:
    """A pure spec-verify batch as the layer hands it to the fused MTP op."""

    def __init__(self, lens, t_cols, state_dtype, seed=0, act="silu", w_dtype=BF, pad=()):
        g = torch.Generator().manual_seed(seed)
        self.lens, self.t = list(lens), t_cols
        n = len(lens)
        tok = sum(lens)
        slots = n * t_cols + 4
        self.state = (torch.randn(slots, HV, V, K, generator=g) * 0.3).to(state_dtype)
        perm = torch.randperm(slots - 3, generator=g)[: n * t_cols] + 3  # slots 1, 2 stay unused
        self.idx = perm.reshape(n, t_cols).to(torch.int32)
        for i in pad:
            self.idx[i] = -1 if i % 2 == 0 else 0
        self.num_acc = torch.tensor([int(torch.randint(1, max(ln, 1) + 1, (1,), generator=g)) for ln in lens],
                                    dtype=torch.int32)
        self.cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), dtype=torch.int32)
        width = 2 * H * K + HV * V
        # the layer's mixed_qkvz: [q | k | v | z] per token; mixed_qkv and the gate are views of it
        qkvz = torch.randn(tok, width + HV * V, generator=g).to(BF)
        self.mixed_qkv = qkvz[:, :width]
        self.gate = qkvz[:, width:].view(tok, HV, V)
        ba = torch.randn(tok, 2 * HV, generator=g).to(BF)
        self.b, self.a = ba.chunk(2, dim=-1)  # split_ba: strided views
        self.A_log = torch.rand(HV, generator=g) * 2 - 1
        self.dt_bias = torch.rand(HV, generator=g) * 2 - 1
        self.w = (torch.rand(V, generator=g) + 0.5).to(w_dtype)
        self.act = act
        self.eps = 1e-6
        self.out = torch.full((tok, HV, V), float("nan")).to(BF)

    def written(self):
        out = set()
        for n, ln in enumerate(self.lens):
            acc = int(self.num_acc[n])
            if ln == 0 or not 1 <= acc <= self.t or int(self.idx[n, acc - 1]) <= 0:
                continue
            out |= {int(s) for s in self.idx[n, :ln].tolist() if s > 0}
        return sorted(out)

    def ref(self):
        st = self.state.to(F64)
        o = reference.post_conv_mtp(self.mixed_qkv, self.a, self.b, self.A_log, self.dt_bias, self.idx, self.cu,
                                    self.num_acc, st, self.gate, self.w, K**-0.5, self.eps, self.act, dtype=F64)
        return o, st

    def run(self):
        return vllm_entry.try_post_conv_mtp(self.mixed_qkv, self.a, self.b, self.A_log, self.dt_bias, self.idx,
                                            self.cu, self.num_acc, self.state, self.gate, self.w, self.out,
                                            K**-0.5, self.eps, self.act)


def _check_mtp(p: MTP):
    before = p.state.clone()
    o_ref, st_ref = p.ref()
    res = p.run()
    assert res is p.out
    assert torch.isfinite(p.out).all()
    assert normed_close(p.out, o_ref)
    w = p.written()
    if p.state.dtype == torch.float32:
        assert rel(p.state[w], st_ref[w]) <= 1e-5
    else:
        assert within_ulp(p.state[w], st_ref[w])
    untouched = [s for s in range(p.state.shape[0]) if s not in w]
    assert torch.equal(p.state[untouched], before[untouched]), "slots outside the written columns are untouched"
    return o_ref


@pytest.mark.parametrize("state_dtype", [torch.float32, BF])
@pytest.mark.parametrize("t", [1, 2, 4])
def test_post_conv_mtp_matches_float64(t, state_dtype):
    p = MTP([t, t, t], t, state_dtype, seed=t)
    if t > 1:
        p.num_acc[0] = t  # the last column: the state of the last accepted token
        p.num_acc[1] = 1
    _check_mtp(p)


@pytest.mark.parametrize("act", ["silu", "sigmoid"])
@pytest.mark.parametrize("w_dtype", [BF, torch.float32])
def test_post_conv_mtp_gate_and_weight_dtypes(act, w_dtype):
    _check_mtp(MTP([3, 3], 3, torch.float32, seed=7, act=act, w_dtype=w_dtype))


def test_post_conv_mtp_ragged_padded_and_out_of_range():
    """Requests of 3, 0 (a graph-padding request), 1 and 2 tokens in 4 columns; a padded row
    (slot -1) and a NULL slot; accepted counts past the columns and 0 read no state."""
    p = MTP([3, 0, 1, 2, 2, 2], 4, torch.float32, seed=13, pad=(4,))
    p.idx[5, 0] = 0  # NULL block in the column the state is read from
    p.num_acc[5] = 1
    # out of range (the op's rule: no initial state, outputs zero); both would read a valid slot
    # of the neighbouring row without the rule
    p.num_acc[2] = 5  # > columns
    p.num_acc[3] = 0  # < 1
    o_ref = _check_mtp(p)
    rows = torch.repeat_interleave(torch.arange(6), torch.tensor(p.lens))
    for n in (2, 3, 4, 5):
        assert (p.out[rows == n] == 0).all() and (o_ref[rows == n] == 0).all()


def test_packed_decode_norm_matches_float64():
    g = torch.Generator().manual_seed(3)
    n, slots = 5, 9
    state = torch.randn(slots, HV, V, K, generator=g) * 0.3
    width = 2 * H * K + HV * V
    qkvz = torch.randn(n, width + HV * V + 8, generator=g).to(BF)
    mixed, gate = qkvz[:, :width], qkvz[:, width: width + HV * V].view(n, HV, V)
    ba = torch.randn(n, 2 * HV, generator=g).to(BF)
    b, a = ba.chunk(2, dim=-1)
    A_log, dt_bias = torch.rand(HV, generator=g) - 0.5, torch.rand(HV, generator=g) - 0.5
    w = torch.rand(V, generator=g).to(BF) + 0.5
    idx = torch.tensor([3, -1, 5, 0, 8], dtype=torch.int32)
    out = torch.full((n, HV, V), float("nan")).to(BF)
    st64 = state.double()
    o = reference.step(mixed[:, : H * K].reshape(n, H, K), mixed[:, H * K: 2 * H * K].reshape(n, H, K),
                       mixed[:, 2 * H * K:].reshape(n, HV, V), a, b, A_log, dt_bias, st64, idx, dtype=F64)
    ref = reference.gated_rmsnorm(o, gate, w, 1e-6, "silu", dtype=F64)
    before = state.clone()
    res = vllm_entry.try_packed_decode_norm(mixed, a, b, A_log, dt_bias, K**-0.5, state, out, idx, gate, w, 1e-6)
    assert res is out
    assert normed_close(out, ref)
    assert (out[idx <= 0] == 0).all()
    assert rel(state[[3, 5, 8]], st64[[3, 5, 8]]) <= 1e-5
    assert torch.equal(state[[0, 1, 2, 4, 6, 7]], before[[0, 1, 2, 4, 6, 7]])


def test_norm_entries_refuse_what_they_do_not_take(caplog):
    p = MTP([2, 2], 2, torch.float32, seed=17)
    vllm_entry._LOGGED.clear()
    base = (p.mixed_qkv, p.a, p.b, p.A_log, p.dt_bias, p.idx, p.cu, p.num_acc)
    with caplog.at_level(logging.WARNING, logger="sndr.kernels"):
        assert vllm_entry.try_post_conv_mtp(*base, p.state.half(), p.gate, p.w, p.out) is None
        assert vllm_entry.try_post_conv_mtp(*base, p.state, p.gate, p.w, p.out,
                                            output_gate_activation="gelu") is None
        assert vllm_entry.try_post_conv_mtp(*base, p.state, p.gate, p.w, p.out.transpose(1, 2)) is None
        assert vllm_entry.try_post_conv_mtp(*base, p.state.half(), p.gate, p.w, p.out) is None
    msgs = [r.getMessage() for r in caplog.records]
    assert sum("torch.float16" in m for m in msgs) == 1, msgs  # once per reason
    assert any("'gelu'" in m for m in msgs) and any("out layout" in m for m in msgs)
    assert all("falls through to vLLM" in m for m in msgs)


# ----------------------------------------------------------------------------- PK0003's default-path wrappers


def test_op_wrapper_routes_to_sndr_or_vllm():
    calls = []

    def original(*args, **kwargs):
        calls.append((args, kwargs))
        return "vllm"

    w = rp_gdn.wrap_post_conv_mtp(original)
    p = MTP([2, 2], 2, torch.float32, seed=19)
    o_ref, _ = p.ref()
    r = w(mixed_qkv=p.mixed_qkv, a=p.a, b=p.b, A_log=p.A_log, dt_bias=p.dt_bias, state_indices=p.idx,
          cu_seqlens=p.cu, num_accepted_tokens=p.num_acc, state=p.state, output_gate=p.gate, norm_weight=p.w,
          out=p.out, scale=K**-0.5, norm_eps=p.eps, output_gate_activation="silu")
    assert r is p.out and not calls and normed_close(p.out, o_ref)
    r = w(p.mixed_qkv, p.a, p.b, p.A_log, p.dt_bias, p.idx, p.cu, p.num_acc, p.state.half(), p.gate, p.w)
    assert r == "vllm" and calls[-1][1] == {"out": None, "scale": 128**-0.5, "norm_eps": 1e-5,
                                            "output_gate_activation": "silu"}
    assert w.__wrapped__ is original and w.__sndr_wraps__ is original


class _Norm:
    def __init__(self, w):
        self.weight, self.bias, self.eps, self.group_size = w, None, 1e-6, None
        self.norm_before_gate, self.activation = True, "silu"


class _Conv:
    def __init__(self, ch):
        self.weight = torch.zeros(ch, 1, 4)
        self.bias = None


def _layer(state, w, prefix="layer.0"):
    layer = types.SimpleNamespace(
        prefix=prefix, norm=_Norm(w), A_log=torch.rand(HV) - 0.5, dt_bias=torch.rand(HV) - 0.5, head_k_dim=K,
        head_v_dim=V, kv_cache=(torch.zeros(state.shape[0], 2 * H * K + HV * V, 3), state), conv1d=_Conv(1),
        activation="silu", enable_packed_recurrent_decode=True, enable_fused_gdn_spec_decode=False,
        gdn_decode_kernel="cuda", gqa_interleaved_layout=False)
    return layer


def _md(**kw):
    base = dict(spec_sequence_masks=None, num_prefills=0, num_decodes=3, num_actual_tokens=3,
                non_spec_state_indices_tensor=torch.tensor([4, 6, -1, 0], dtype=torch.int32))
    base.update(kw)
    return types.SimpleNamespace(**base)


def test_layer_wrapper_fuses_plain_decode_and_hands_back_the_rest():
    g = torch.Generator().manual_seed(23)
    state = torch.randn(8, HV, V, K, generator=g) * 0.3
    w = (torch.rand(V, generator=g) + 0.5).to(BF)
    layer = _layer(state, w)
    conv_calls, vllm_calls = [], []

    def conv(x, conv_state, weight, bias, activation, conv_state_indices=None, validate_data=True):
        conv_calls.append(conv_state_indices.clone())
        x.mul_(0.5)  # in place, as vLLM's causal_conv1d_update writes its output over x
        return x

    md_box = {}
    glob = {"get_forward_context": lambda: types.SimpleNamespace(attn_metadata=md_box.get("md")),
            "is_conv_state_dim_first": lambda: True, "causal_conv1d_update": conv,
            "fused_recurrent_gated_delta_rule_packed_decode": None}

    def original(self, mixed_qkv, b, a, output_gate, core_attn_out):
        vllm_calls.append(self)

    # the factory takes vLLM's module globals from the original; here they are the test's stand-ins
    wrapped = _with_globals(rp_gdn.wrap_forward_core_fused_norm, original, glob)

    n_pad = 4  # the batch is padded to 4 tokens (CUDA-graph size); 3 are real
    width = 2 * H * K + HV * V
    qkvz = torch.randn(n_pad, width + HV * V, generator=g).to(BF)
    mixed, gate = qkvz[:, :width], qkvz[:, width:].view(n_pad, HV, V)
    ba = torch.randn(n_pad, 2 * HV, generator=g).to(BF)
    b, a = ba.chunk(2, dim=-1)
    out = torch.zeros(n_pad, HV, V, dtype=BF)

    # pure plain decode: sndr runs the conv (vLLM's function) and the fused decode + norm
    md_box["md"] = {"layer.0": _md()}
    post = mixed[:3].clone() * 0.5
    st64 = state.double()
    idx = torch.tensor([4, 6, -1], dtype=torch.int32)
    o = reference.step(post[:, : H * K].reshape(3, H, K), post[:, H * K: 2 * H * K].reshape(3, H, K),
                       post[:, 2 * H * K:].reshape(3, HV, V), a[:3], b[:3], layer.A_log, layer.dt_bias, st64, idx,
                       dtype=F64)
    ref = reference.gated_rmsnorm(o, gate[:3], w, 1e-6, "silu", dtype=F64)
    wrapped(layer, mixed, b, a, gate, out)
    assert not vllm_calls and len(conv_calls) == 1 and conv_calls[0].tolist() == [4, 6, -1]
    assert normed_close(out[:3], ref) and (out[3] == 0).all()
    assert rel(state[[4, 6]], st64[[4, 6]]) <= 1e-5

    # everything else goes to vLLM's method, with nothing of sndr's run
    for md in (None, {"other": _md()}, {"layer.0": _md(num_prefills=1)},
               {"layer.0": _md(spec_sequence_masks=torch.ones(3, dtype=torch.bool))},
               {"layer.0": _md(num_decodes=0)}):
        md_box["md"] = md
        wrapped(layer, mixed, b, a, gate, out)
    assert len(vllm_calls) == 5 and len(conv_calls) == 1
    md_box["md"] = {"layer.0": _md()}
    layer.enable_packed_recurrent_decode = False
    wrapped(layer, mixed, b, a, gate, out)
    layer.enable_packed_recurrent_decode = True
    layer.norm.group_size = V // 2
    wrapped(layer, mixed, b, a, gate, out)
    assert len(vllm_calls) == 7 and len(conv_calls) == 1


def _with_globals(factory, original, glob):
    """``factory(original)`` where ``original.__globals__`` is ``glob`` (vLLM's module in production)."""
    clone = types.FunctionType(original.__code__, {**original.__globals__, **glob}, original.__name__,
                               original.__defaults__, original.__closure__)
    wrapped = factory(clone)
    return wrapped


def test_init_wrapper_routes_only_layers_vllm_accepted_for_its_cuda_decode(monkeypatch):
    def init(self, config, vllm_config, prefix="", gqa_interleaved_layout=False, reduce_results=True):
        self.args = (config, vllm_config, prefix, reduce_results)

    w = rp_gdn.wrap_layer_init(init)
    state = torch.zeros(2, HV, V, K)
    # on by default (no SNDR_ENABLE_PK0003=1) no layer changes forward
    monkeypatch.delenv("SNDR_ENABLE_PK0003", raising=False)
    monkeypatch.setattr(vllm_entry, "_SCOPE", {})
    ok = _layer(state, torch.ones(V))
    w(ok, 1, 2, prefix="p", reduce_results=False)
    assert ok.args == (1, 2, "p", False) and ok.enable_fused_gdn_spec_decode is False
    # opted in explicitly: the layers vLLM accepted for its CUDA decode
    monkeypatch.setenv("SNDR_ENABLE_PK0003", "1")
    monkeypatch.setattr(vllm_entry, "_SCOPE", {})
    ok = _layer(state, torch.ones(V))
    w(ok, 1, 2, prefix="p", reduce_results=False)
    assert ok.args == (1, 2, "p", False) and ok.enable_fused_gdn_spec_decode is True
    for attr, value in (("gdn_decode_kernel", "triton"), ("gqa_interleaved_layout", True),
                        ("enable_packed_recurrent_decode", False), ("quant_config", object())):
        layer = _layer(state, torch.ones(V))
        setattr(layer, attr, value)
        w(layer, 1, 2)
        assert layer.enable_fused_gdn_spec_decode is False, attr
    layer = _layer(state, torch.ones(V))
    layer.norm.norm_before_gate = False
    w(layer, 1, 2)
    assert layer.enable_fused_gdn_spec_decode is False
    assert vllm_layer._norm_ok(layer) == "norm after gate"


@pytest.mark.parametrize("t", [1, 3])
def test_dense_reference_equals_the_naive_one(t):
    """reference.post_conv_mtp_dense (the benchmark's float64 check) against the naive loop."""
    p = MTP([t] * 3, t, torch.float32, seed=29 + t)
    o_naive, st_naive = p.ref()
    st = p.state.to(F64)
    o = reference.post_conv_mtp_dense(p.mixed_qkv, p.a, p.b, p.A_log, p.dt_bias, p.idx, p.num_acc, st, p.gate, p.w,
                                      K**-0.5, p.eps, p.act)
    assert rel(o, o_naive) <= 1e-12
    assert rel(st, st_naive) <= 1e-12


@pytest.mark.parametrize("bv,warps,state_dtype,prefetch,stream,t_arg",
                         [(8, 1, torch.float32, True, False, 3), (32, 1, torch.float32, True, False, 3),
                          (64, 2, torch.float32, True, False, 3), (16, 1, BF, True, False, 3),
                          (64, 2, BF, True, False, 3), (8, 1, torch.float32, False, True, 3),
                          (16, 1, BF, False, False, 3), (64, 2, torch.float32, False, True, 3),
                          (64, 2, BF, True, False, 2)])
def test_fused_norm_launch_shapes_agree(bv, warps, state_dtype, prefetch, stream, t_arg):
    """1, 2, 4 or 8 programs per head (V = 64): the arrival counter picks the last one in each case,
    and leaves every counter at zero for the next launch; one program per head (64 x 2) normalises
    in the program, token by token (also with ``t_arg`` = 2, fewer index columns than a request's
    3 tokens). Without the next-token prefetch and with streaming state traffic the results are
    the same. A request whose initial state's column is also its last token's (accepted = T) and
    one with accepted = 1."""
    p = MTP([3, 3, 1, 2], 3, state_dtype, seed=37)
    p.num_acc[0], p.num_acc[1] = 3, 1
    o_ref, st_ref = p.ref()
    kernels.gdn_step(p.mixed_qkv, None, None, p.a, p.b, p.A_log, p.dt_bias, p.state, p.idx, p.out, scale=K**-0.5,
                     n_seqs=4, tokens_per_seq=t_arg, cu_seqlens=p.cu, num_accepted_tokens=p.num_acc, idx_tok_stride=1,
                     config=kernels.StepConfig(bv, warps, prefetch=prefetch, stream=stream), output_gate=p.gate,
                     norm_weight=p.w, norm_eps=p.eps, strict_accepted=t_arg == 3)
    assert normed_close(p.out, o_ref)
    w = p.written()
    if state_dtype == torch.float32:
        assert rel(p.state[w], st_ref[w]) <= 1e-5
    else:
        assert within_ulp(p.state[w], st_ref[w])
    assert all(int((c != 0).sum()) == 0 for _, c in kernels._WORKSPACES.values())


# ----------------------------------------------------------------------------- PK0003's canary problem


@pytest.mark.parametrize("decode,t", [(True, 1), (False, 3)])
def test_canary_problem_passes_the_kernel_and_catches_a_wrong_one(decode, t, monkeypatch):
    """The canary's fixed problem (``gdn.canary.step_check``) on the interpreter: sndr's step is within the
    tolerance of float64 by a wide margin; a step that drops the gated norm's weight, or one token's state
    update, is caught."""
    from sndr.kernels.gdn import canary

    err, tol = canary.step_check(H, HV, K, V, torch.float32, t, decode, "cpu")
    assert err <= tol / 4, err
    real = kernels.gdn_step

    def no_weight(*args, **kw):
        kw["norm_weight"] = torch.ones_like(kw["norm_weight"])
        return real(*args, **kw)

    monkeypatch.setattr(kernels, "gdn_step", no_weight)
    err, tol = canary.step_check(H, HV, K, V, torch.float32, t, decode, "cpu")
    assert err > tol, err

    def stale_state(*args, **kw):
        state = args[7]
        before = state.clone()
        out = real(*args, **kw)
        state.copy_(before)  # no state written
        return out

    monkeypatch.setattr(kernels, "gdn_step", stale_state)
    err, tol = canary.step_check(H, HV, K, V, torch.float32, t, decode, "cpu")
    assert err > tol, err
