"""PK0003 installed the way the startup hook installs it, in a real vLLM 0.32.0 (CPU) install.

A child process of ``$SNDR_TEST_VLLM_PYTHON`` (default ``~/.cache/sndr/vllm-0.32.0-venv/bin/python``,
``sndr.env.vllm_test_python``;
skipped when absent) applies PK0003's runtime edits with sndr's
RuntimePatcher before vLLM is imported, imports the Qwen GDN layer module and
checks: both edits are ``applied``; the layer module's two names carry the
patch mark and vLLM's signatures and wrap vLLM's functions; the wrapped packed
decode and sigmoid-gating update, called with CPU tensors under Triton's
interpreter, match the fp32 reference (vLLM's own kernels cannot run on a CPU
install, whose Triton is a placeholder: tests/kernels/test_gdn_vllm_harness.py
compares with them). With a Triton other than the pinned 3.6, whose
interpreter rejects the spec kernel's scalar-and-vector load masks, the spec
call is checked for routing into sndr's launch instead; a float16 state falls through to the wrapped function;
revert restores the originals. As in vLLM's plugin loader, ``vllm`` itself is
imported before the patch is applied, the layer module after.
"""

from __future__ import annotations

import pytest

from tests.patches.conftest import run_child

SCRIPT = r'''
import json, os, sys
os.environ["TRITON_INTERPRET"] = "1"
from sndr.load import load_patch_set
from sndr.startup.runtime import RuntimePatcher

# vLLM's plugin loader runs sndr's hook inside an imported ``vllm`` package (the
# layer module itself is imported later, with the model): the same order here
import vllm  # noqa: F401
assert "vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn" not in sys.modules
ps = load_patch_set(packs=False)
specs = [dict(r.model_dump(mode="json"), patch=p.id, allowed=["sndr"])
         for p in ps.patches if p.id == "PK0003" for r in p.runtime]
patcher = RuntimePatcher()
patcher.apply(specs)

import torch
import vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn as qwen
from sndr.binding import signature_of_callable
from sndr.kernels.gdn import reference
from sndr.kernels.turboquant_k8v4 import _interp
_interp.fix_scalar_index()

out = {"outcomes": sorted((o.key, o.verdict, o.reason) for o in patcher.outcomes.values())}
pd, sg = qwen.fused_recurrent_gated_delta_rule_packed_decode, qwen.fused_sigmoid_gating_delta_rule_update
out["marks"] = [getattr(pd, "__sndr_patch__", None), getattr(sg, "__sndr_patch__", None)]
out["signatures"] = [signature_of_callable(pd), signature_of_callable(sg)]

def rel(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm())

g = torch.Generator().manual_seed(0)
N, H, HV, K, V = 3, 2, 4, 32, 32
mixed = torch.randn(N, 2 * H * K + HV * V, generator=g)
a, b = torch.randn(N, HV, generator=g), torch.randn(N, HV, generator=g)
A_log, dt = torch.rand(HV, generator=g) - 0.5, torch.rand(HV, generator=g) - 0.5
st = torch.randn(6, HV, V, K, generator=g) * 0.3
idx = torch.tensor([2, -1, 4], dtype=torch.int32)
s1, s2 = st.clone(), st.clone()
o1 = torch.empty(N, 1, HV, V)
res = pd(mixed, a, b, A_log, dt, K ** -0.5, s1, o1, idx, use_qk_l2norm_in_kernel=True)
o2 = reference.step(mixed[:, :H * K].view(N, H, K), mixed[:, H * K:2 * H * K].view(N, H, K),
                    mixed[:, 2 * H * K:].view(N, HV, V), a, b, A_log, dt, s2, idx)
valid = idx > 0
out["packed"] = [rel(o1[valid, 0], o2[valid]), rel(s1, s2), bool((o1[~valid] == 0).all()), res[0] is o1]

T = 3
q, k = torch.randn(1, N * T, H, K, generator=g), torch.randn(1, N * T, H, K, generator=g)
v = torch.randn(1, N * T, HV, V, generator=g)
a, b = torch.randn(N * T, HV, generator=g), torch.randn(N * T, HV, generator=g)
st = torch.randn(12, HV, V, K, generator=g) * 0.3
idx2 = torch.tensor([[1, 2, 3], [4, 5, 6], [7, 8, 9]], dtype=torch.int32)
na = torch.tensor([1, 3, 2], dtype=torch.int32)
cu = torch.arange(0, N * T + 1, T, dtype=torch.int32)
s1, s2 = st.clone(), st.clone()
kw = dict(A_log=A_log, a=a, b=b, dt_bias=dt, q=q, k=k, v=v, inplace_final_state=True, cu_seqlens=cu,
          ssm_state_indices=idx2, num_accepted_tokens=na, use_qk_l2norm_in_kernel=True)
import triton
from sndr.kernels.gdn import kernels
out["triton"] = triton.__version__
if triton.__version__.startswith("3.6"):  # the [kernels] pin
    r1 = sg(initial_state=s1, **kw)
    o2 = reference.step(q[0], k[0], v[0], a, b, A_log, dt, s2, idx2, cu_seqlens=cu, num_accepted_tokens=na)
    out["spec"] = [rel(r1[0][0], o2), rel(s1, s2), r1[1] is s1]
else:
    # newer interpreters reject the spec kernel's scalar-and-vector load masks (compiled
    # code is unaffected): check the routing into sndr's launch instead of the numbers
    seen = []
    real = kernels.run_plan
    kernels.run_plan = lambda plan, *t, **kw2: seen.append([t[8] is s1, t[9] is idx2, t[10] is na, t[11] is cu])
    try:
        r1 = sg(initial_state=s1, **kw)
    finally:
        kernels.run_plan = real
    out["spec"] = ["routed", seen, r1[1] is s1]

# vLLM's own kernels cannot run here (CPU vLLM uses a Triton placeholder); a spy stands for them
calls = []
import sndr.runtime_patches.gdn as rp
def spy(*args, **kwargs):
    calls.append(sorted(kwargs))
    return "vllm"
w = rp.wrap_sigmoid_gating_update(spy)
out["fallthrough"] = [w(initial_state=st.clone().half(), **kw), len(calls)]
out["wraps_vllm"] = [pd.__sndr_wraps__.__module__, sg.__sndr_wraps__.__module__]

# vLLM's default path: the fused MTP op's Python wrapper (the layer calls it as ops.<name>)
import vllm._custom_ops as ops
mtp = ops.fused_gdn_decode_post_conv_mtp
layer_cls = qwen.QwenGatedDeltaNetAttention
out["default_path_marks"] = [getattr(mtp, "__sndr_patch__", None),
                             getattr(layer_cls._forward_core_fused_norm, "__sndr_patch__", None),
                             getattr(layer_cls.__init__, "__sndr_patch__", None)]
out["default_path_signatures"] = [signature_of_callable(mtp), signature_of_callable(layer_cls._forward_core_fused_norm),
                                  signature_of_callable(layer_cls.__init__)]
tok = N * T
qkvz = torch.randn(tok, 2 * H * K + 2 * HV * V, generator=g).to(torch.bfloat16)
mq, gate = qkvz[:, :2 * H * K + HV * V], qkvz[:, 2 * H * K + HV * V:].view(tok, HV, V)
ba = torch.randn(tok, 2 * HV, generator=g).to(torch.bfloat16)
bb, aa = ba.chunk(2, dim=-1)
w_n = torch.rand(V, generator=g).to(torch.bfloat16) + 0.5
s1, s2 = st.clone(), st.clone().double()
o_m = torch.empty(tok, HV, V, dtype=torch.bfloat16)
if triton.__version__.startswith("3.6"):
    r = mtp(mq, aa, bb, A_log, dt, idx2, cu, na, s1, gate, w_n, out=o_m, scale=K ** -0.5, norm_eps=1e-6,
            output_gate_activation="silu")
    o2 = reference.post_conv_mtp(mq, aa, bb, A_log, dt, idx2, cu, na, s2, gate, w_n, K ** -0.5, 1e-6, "silu",
                                 dtype=torch.float64)
    out["mtp"] = [rel(o_m, o2), rel(s1, s2), r is o_m]
else:
    seen = []
    real = kernels.run_plan
    kernels.run_plan = lambda plan, *t, **kw2: seen.append([t[8] is s1, kw2.get("z") is gate])
    try:
        r = mtp(mq, aa, bb, A_log, dt, idx2, cu, na, s1, gate, w_n, out=o_m, scale=K ** -0.5, norm_eps=1e-6)
    finally:
        kernels.run_plan = real
    out["mtp"] = ["routed", seen, r is o_m]
out["mtp_wraps"] = mtp.__sndr_wraps__.__module__

out["revert"] = patcher.revert()
out["restored"] = [getattr(qwen.fused_sigmoid_gating_delta_rule_update, "__sndr_patch__", None) is None,
                   getattr(ops.fused_gdn_decode_post_conv_mtp, "__sndr_patch__", None) is None,
                   getattr(layer_cls.__init__, "__sndr_patch__", None) is None]
print("SNDR_RESULT " + json.dumps(out, default=repr))
'''


@pytest.fixture(scope="module")
def child(vllm_py):
    return run_child(vllm_py, SCRIPT)


@pytest.mark.vllm_install
def test_pk0003_applies_to_the_qwen_gdn_layer(child):
    assert [o[:2] for o in child["outcomes"]] == [["PK0003/decode-fused-norm", "applied"],
                                                   ["PK0003/packed-decode", "applied"],
                                                   ["PK0003/plain-decode-routing", "applied"],
                                                   ["PK0003/post-conv-mtp", "applied"],
                                                   ["PK0003/sigmoid-gating-update", "applied"]]
    assert child["marks"] == ["PK0003/packed-decode", "PK0003/sigmoid-gating-update"]
    assert child["signatures"][0].startswith("(mixed_qkv, a, b, A_log, dt_bias, scale, initial_state, out,")
    assert child["signatures"][1].endswith("use_qk_l2norm_in_kernel=, is_kda=)")


@pytest.mark.vllm_install
def test_installed_wrappers_match_vllm(child):
    e_out, e_state, zeros, same_out = child["packed"]
    assert e_out <= 1e-5 and e_state <= 1e-5 and zeros and same_out
    o, s, same = child["spec"]
    if child["triton"].startswith("3.6"):
        assert o <= 1e-5 and s <= 1e-5 and same is True
    else:  # the spec kernel's numbers are checked by the interpreter tests (Triton 3.6) and on the GPU
        assert o == "routed" and s == [[True, True, True, True]] and same is True
    assert child["wraps_vllm"] == ["vllm.third_party.flash_linear_attention.ops.fused_recurrent",
                                   "vllm.third_party.flash_linear_attention.ops.fused_sigmoid_gating"]


@pytest.mark.vllm_install
def test_unsupported_state_falls_through_and_revert_restores(child):
    assert child["fallthrough"] == ["vllm", 1]
    assert child["revert"] == [] and child["restored"] == [True, True, True]


@pytest.mark.vllm_install
def test_default_path_entries_bind_and_the_op_wrapper_runs_sndr(child):
    """vLLM's default path (VLLM_GDN_DECODE_KERNEL=cuda): the fused MTP op's wrapper and the layer's
    two methods carry the patch with vLLM's signatures; the op wrapper's result is the float64 one
    (bf16 outputs rounded twice: <= 8e-3 relative under the interpreter's truncation)."""
    assert child["default_path_marks"] == ["PK0003/post-conv-mtp", "PK0003/decode-fused-norm",
                                           "PK0003/plain-decode-routing"]
    assert child["default_path_signatures"][0].startswith("(mixed_qkv, a, b, A_log, dt_bias, state_indices,")
    assert child["default_path_signatures"][1] == "(self, mixed_qkv, b, a, output_gate, core_attn_out)"
    assert child["default_path_signatures"][2] == "(self, config, vllm_config, prefix=, gqa_interleaved_layout=, reduce_results=)"
    assert child["mtp_wraps"] == "vllm._custom_ops"
    o, s, same = child["mtp"]
    if child["triton"].startswith("3.6"):
        assert o <= 8e-3 and s <= 1e-5 and same is True
    else:
        assert o == "routed" and s == [[True, True]] and same is True
