"""PR0001 (top-k/top-p parameter check) and PR0002 (TurboQuant decode metadata check).

The replacements are wrapper factories (``wrap = true``). Tested twice on the
CPU install of vLLM 0.32.0: the wrappers directly (rejections, pass-through,
signature), and installed by sndr's RuntimePatcher from the shipped TOML the
way the startup hook does, before vLLM imports the targets.
"""

from __future__ import annotations

import pytest

from sndr.binding import find_binding
from sndr.load import load_patch_set

from .conftest import ok, raised, run_cases

WRAPPERS = r'''
import inspect
import torch

import vllm.v1.sample.ops.topk_topp_sampler as tk
import vllm.v1.attention.ops.triton_turboquant_decode as tqd
from sndr.binding import signature_of_callable
from sndr.runtime_patches.sampling import wrap_apply_top_k_top_p
from sndr.runtime_patches.turboquant import wrap_turboquant_decode

calls = []
def fake(*args, **kwargs):
    calls.append((len(args), sorted(kwargs)))
    return "original-result"

topk = wrap_apply_top_k_top_p(tk.apply_top_k_top_p)
logits = torch.randn(4, 50)

@case("topk_signature")
def _():
    return {"live": signature_of_callable(tk.apply_top_k_top_p), "wrapper": str(inspect.signature(topk)),
            "original": str(inspect.signature(tk.apply_top_k_top_p))}

@case("topk_short_k")
def _():
    topk(logits, torch.full((3,), 5), None)

@case("topk_2d_p")
def _():
    topk(logits, None, torch.full((4, 1), 0.9))

@case("topk_meta_device")
def _():
    topk(logits, torch.full((4,), 5, device="meta"), None)

@case("topk_pass_through")
def _():
    calls.clear()
    w = wrap_apply_top_k_top_p(fake)
    return [w(logits, torch.full((4,), 5), torch.full((4,), 0.9)), w(logits, k=None, p=None), list(calls)]

B, HQ, HK, D = 2, 8, 2, 128
def tq_args(**over):
    a = dict(query=torch.zeros(B, HQ, D), kv_cache=torch.zeros(4, 16, HK, 100, dtype=torch.uint8),
             block_table=torch.zeros(B, 4, dtype=torch.int32), seq_lens=torch.ones(B, dtype=torch.int32),
             Pi=torch.eye(D), centroids=torch.zeros(16), scale=0.1, mse_bits=4, key_packed_size=68,
             value_quant_bits=4)
    a.update(over)
    return a
tqw = wrap_turboquant_decode(fake)

@case("tq_signature")
def _():
    return signature_of_callable(tqd.triton_turboquant_decode_attention)

@case("tq_int64_block_table")
def _():
    tqw(**tq_args(block_table=torch.zeros(B, 4, dtype=torch.int64)))

@case("tq_short_seq_lens")
def _():
    tqw(**tq_args(seq_lens=torch.ones(1, dtype=torch.int32)))

@case("tq_heads")
def _():
    tqw(**tq_args(query=torch.zeros(B, 6, D), kv_cache=torch.zeros(4, 16, 4, 100, dtype=torch.uint8)))

@case("tq_rotation_96")
def _():
    tqw(**tq_args(query=torch.zeros(B, HQ, 96), Pi=torch.eye(128)))

@case("tq_rotation_ignored_for_fp8_keys")
def _():
    calls.clear()
    return [tqw(**tq_args(query=torch.zeros(B, HQ, 96), Pi=torch.eye(128), key_fp8=True)), list(calls)]

@case("tq_positional_pass_through")
def _():
    calls.clear()
    a = tq_args()
    return [tqw(*[a[k] for k in ("query", "kv_cache", "block_table", "seq_lens", "Pi", "centroids", "scale",
                                 "mse_bits", "key_packed_size", "value_quant_bits")]), list(calls)]
'''

INSTALLED = r'''
import sys
from sndr.load import load_patch_set
from sndr.startup.runtime import RuntimePatcher

assert not any(m.startswith("vllm") for m in sys.modules)
ps = load_patch_set(packs=False)
specs = [dict(r.model_dump(mode="json"), patch=p.id, allowed=["sndr"])
         for p in ps.patches if p.id in ("PR0001", "PR0002") for r in p.runtime]
patcher = RuntimePatcher()
first = [(o.key, o.verdict, o.reason) for o in patcher.apply(specs)]

import torch
import vllm.v1.attention.backends.turboquant_attn as backend
import vllm.v1.attention.ops.triton_turboquant_decode as tqd
import vllm.v1.sample.ops.topk_topp_sampler as tk
import vllm.v1.sample.rejection_sampler as rs

@case("outcomes")
def _():
    return {"at_apply": first, "after_import": [(o.key, o.verdict, o.reason) for o in patcher.outcomes.values()]}

@case("marks")
def _():
    return {"ops": getattr(tqd.triton_turboquant_decode_attention, "__sndr_patch__", None),
            "backend_name": getattr(backend.triton_turboquant_decode_attention, "__sndr_patch__", None),
            "topk": getattr(tk.apply_top_k_top_p, "__sndr_patch__", None),
            "rejection_sampler_name": getattr(rs.apply_top_k_top_p, "__sndr_patch__", None)}

@case("installed_wrapper_rejects")
def _():
    tk.apply_top_k_top_p(torch.randn(4, 10), torch.full((2,), 3), None)

@case("revert")
def _():
    problems = patcher.revert()
    return {"problems": problems, "restored": getattr(tk.apply_top_k_top_p, "__sndr_patch__", None) is None}
'''


@pytest.fixture(scope="module")
def wrappers(vllm_py):
    return run_cases(vllm_py, WRAPPERS)


@pytest.fixture(scope="module")
def installed(vllm_py):
    return run_cases(vllm_py, INSTALLED)


def test_declared_bindings_match_the_pin(vllm_pin_root):
    """The signature/source hash in the TOML are the ones sndr.binding computes on 0.32.0."""
    ps = load_patch_set(packs=False)
    for pid in ("PR0001", "PR0002"):
        for r in ps.by_id[pid].runtime:
            module, qual = r.target.split(":")
            text = (vllm_pin_root / (module.replace(".", "/") + ".py")).read_text()
            b = find_binding(text, qual)
            assert b is not None, r.target
            assert r.signature == b.signature
            if r.source_sha256:
                assert r.source_sha256 == b.source_sha256




@pytest.mark.vllm_install
def test_topk_wrapper_keeps_the_signature(wrappers):
    sig = ok(wrappers, "topk_signature")
    assert sig["live"] == "(logits, k, p)"
    assert sig["wrapper"] == sig["original"]


@pytest.mark.vllm_install
@pytest.mark.parametrize("case,fragments", [
    ("topk_short_k", ["k has shape (3,)", "expected (4,)"]),
    ("topk_2d_p", ["p has shape (4, 1)"]),
    ("topk_meta_device", ["k is on meta"]),
])
def test_topk_wrapper_rejects(wrappers, case, fragments):
    raised(wrappers, case, "ValueError", "top-k/top-p", *fragments)


@pytest.mark.vllm_install
def test_topk_wrapper_passes_valid_calls_through(wrappers):
    first, second, calls = ok(wrappers, "topk_pass_through")
    assert first == second == "original-result"
    assert calls == [[3, []], [1, ["k", "p"]]]


@pytest.mark.vllm_install
def test_turboquant_wrapper(wrappers):
    assert ok(wrappers, "tq_signature").startswith("(query, kv_cache, block_table, seq_lens, Pi,")
    raised(wrappers, "tq_int64_block_table", "ValueError", "block_table must be int32", "torch.int64")
    raised(wrappers, "tq_short_seq_lens", "ValueError", "seq_lens must be int32 with 2 entries")
    raised(wrappers, "tq_heads", "ValueError", "6 query heads", "4 KV heads")
    raised(wrappers, "tq_rotation_96", "ValueError", "(128, 128)", "expected (96, 96)", "turboquant_k8v4")
    assert ok(wrappers, "tq_rotation_ignored_for_fp8_keys")[0] == "original-result"
    result, calls = ok(wrappers, "tq_positional_pass_through")
    assert result == "original-result" and calls == [[10, []]]


@pytest.mark.vllm_install
def test_runtime_patcher_installs_both_before_vllm_imports_them(installed):
    out = ok(installed, "outcomes")
    assert {k: v for k, v, _ in out["after_import"]} == {
        "PR0001/wrap-apply-top-k-top-p": "applied", "PR0002/wrap-turboquant-decode": "applied"}, out
    marks = ok(installed, "marks")
    assert marks == {"ops": "PR0002/wrap-turboquant-decode",
                     "backend_name": "PR0002/wrap-turboquant-decode",
                     "topk": "PR0001/wrap-apply-top-k-top-p",
                     "rejection_sampler_name": "PR0001/wrap-apply-top-k-top-p"}


@pytest.mark.vllm_install
def test_installed_wrapper_guards_and_reverts(installed):
    raised(installed, "installed_wrapper_rejects", "ValueError", "k has shape (2,)")
    assert ok(installed, "revert") == {"problems": [], "restored": True}


def test_module_globals_reads_through_every_sndr_wrapper():
    """A wrapper that re-implements part of a vLLM method reads names from vLLM's module, not sndr's: through
    a chain of sndr wrappers (PK0004 over PK0003 over vLLM's function) both GDN wrappers get the innermost
    function's globals. Hermetic: a stdlib function stands in for vLLM's."""
    import json.decoder

    from sndr.runtime_patches import gdn, gdn_replay, module_globals, wraps_original

    target = json.decoder.JSONDecoder.decode
    inner = gdn.wrap_forward_core_fused_norm(target)
    outer = gdn_replay.wrap_forward_core_fused_norm(inner)
    assert module_globals(target) is json.decoder.__dict__
    assert module_globals(outer) is json.decoder.__dict__ and module_globals(inner) is json.decoder.__dict__
    for wrapper in (inner, outer, gdn.wrap_forward_core_fused_norm(outer)):
        held = [c.cell_contents for c in wrapper.__closure__ if isinstance(c.cell_contents, dict)]
        assert held == [json.decoder.__dict__], wrapper
    bare = wraps_original(target)(lambda *a: None)
    assert module_globals(bare) is json.decoder.__dict__ and bare.__sndr_wraps__ is target
