"""The PN* backports: each applies on vLLM 0.32.0 and reads merged on 0.33.0, and
the ones that can run on a CPU behave like upstream's fix.

Behaviour cases run the patched 0.32.0 tree with the CPU install of vLLM.
"""

from __future__ import annotations

import pytest

from sndr.load import load_patch_set
from sndr.model import Verdict
from sndr.testing import PatchCheck
from sndr.tree import open_tree

from .conftest import ok, raised, run_cases

BACKPORTS = sorted(p.id for p in load_patch_set(packs=False).patches if p.id.startswith("PN"))


SHIPPED = load_patch_set(packs=False)


@pytest.fixture(scope="module")
def on_candidate(vllm_candidate_root):
    """sndr.testing's harness on vLLM 0.33.0 (``sndr_patch_on_pin`` is the same on the pin)."""
    return PatchCheck(vllm_candidate_root, open_tree(vllm_candidate_root).version)


@pytest.mark.parametrize("pid", BACKPORTS)
def test_backport_applies_on_pin_and_is_merged_upstream(sndr_patch_on_pin, on_candidate, pid):
    """On the pin, alone: every edit applies, the patched files compile, and applying again changes nothing.
    Upstream (0.33.0): every edit reads merged. (The whole set together: tests/test_shipped_set.py.)"""
    path = SHIPPED.source_of(pid)
    edits = [e.name for f in SHIPPED.by_id[pid].files for e in f.edits]
    sndr_patch_on_pin(path, status="applies", verdicts={e: Verdict.APPLIES for e in edits})
    on_candidate(path, status="merged", verdicts={e: Verdict.MERGED for e in edits})


@pytest.mark.parametrize("pid", BACKPORTS)
def test_backport_is_documented(pid):
    p = load_patch_set(packs=False).by_id[pid]
    assert p.title and len(p.description) > 200
    assert p.vllm == ">=0.32,<0.34"
    assert ("upstream PR was not identified" in " ".join(p.description.split())) or p.upstream, \
        "name the upstream PR, or say it was not identified"


SCRIPT = r'''
from types import SimpleNamespace

import torch

from vllm.v1.core.block_pool import BlockPool
from vllm.v1.core.encoder_cache_manager import EncoderCacheManager
from vllm.v1.core.kv_cache_utils import KVCacheBlock, trim_null_head

@case("PN0005_null_block_not_refcounted")
def _():
    pool = BlockPool(num_gpu_blocks=8, enable_caching=True, hash_block_size=16)
    null = pool.null_block
    before = null.ref_cnt
    pool.touch([null])
    touched = null.ref_cnt
    pool.free_blocks([null])
    return [before, touched, null.ref_cnt, pool.get_num_free_blocks()]

@case("PN0016_trim_null_head")
def _():
    null = KVCacheBlock(0, is_null=True)
    a, b = KVCacheBlock(1), KVCacheBlock(2)
    return [[blk.block_id for blk in trim_null_head(seq)] for seq in
            ([null, null, null, a, b], [a, b], [], [null, a, null, b])]

@case("PN0006_encoder_cache_hash_refs")
def _():
    req = SimpleNamespace(request_id="r", get_num_encoder_embeds=lambda i: 10,
                          mm_features=[SimpleNamespace(identifier=h) for h in ("A", "B", "A")])
    m = EncoderCacheManager(cache_size=100)
    m.allocate(req, 0)
    m.allocate(req, 1)
    hit = m.check_and_update_cache(req, 2)
    refs = dict(m.request_hash_refs["r"])
    m.free_encoder_input(req, 0)          # first occurrence of A: A must stay referenced
    a_held = "r" in m.cached["A"]
    m.free_encoder_input(req, 2)          # last occurrence: now freeable
    m.free_encoder_input(req, 2)          # twice: no double decrement
    a_freed = "r" not in m.cached["A"]
    m.free_encoder_input(req, 1)
    return {"hit": hit, "refs": refs, "a_held": a_held, "a_freed": a_freed,
            "left": m.request_hash_refs, "free_slots": m.num_freeable_slots}

@case("PN0007_ue8m0_scales_are_powers_of_two")
def _():
    from vllm.model_executor.layers.quantization.input_quant_fp8 import QuantFP8
    # the group path reads only these attributes; building a real QuantFP8
    # needs a VllmConfig, which cannot infer a device from the source tree
    q = SimpleNamespace(group_size=128, use_ue8m0=True, column_major_scales=False)
    x = torch.zeros(2, 256)
    x[1, :128] = 1e-12                      # a tiny group, and all-zero groups
    _, scales = QuantFP8._quantize_group_native(q, x)
    s = scales.float().flatten()
    mant = (s.view(torch.int32) & 0x7FFFFF)
    return {"scales": s.tolist(), "mantissa_bits_zero": bool((mant == 0).all()), "positive": bool((s > 0).all())}

@case("PN0018_float_kv_dtype_mismatch")
def _():
    from vllm.config import VllmConfig
    bad = SimpleNamespace(cache_config=SimpleNamespace(cache_dtype="float16"),
                          model_config=SimpleNamespace(dtype=torch.bfloat16))
    VllmConfig._reject_mismatched_float_kv_cache(bad)

@case("PN0018_matching_dtype_ok")
def _():
    from vllm.config import VllmConfig
    good = SimpleNamespace(cache_config=SimpleNamespace(cache_dtype="bfloat16"),
                           model_config=SimpleNamespace(dtype=torch.bfloat16))
    return VllmConfig._reject_mismatched_float_kv_cache(good)

@case("PN0022_step3_param_with_angle_bracket")
def _():
    from vllm.tool_parsers.step3_tool_parser import Step3ToolParser
    text = ('<steptml:invoke name="run_code"><steptml:parameter name="code">if a < b:\n    print(a)'
            '</steptml:parameter><steptml:parameter name="lang">python</steptml:parameter></steptml:invoke>')
    return list(Step3ToolParser._parse_steptml_invoke(text))
'''


@pytest.fixture(scope="module")
def results(vllm_py, patched_pin_root):
    return run_cases(vllm_py, SCRIPT, patched_pin_root)


@pytest.mark.vllm_install
def test_pn0005_block_pool_leaves_the_null_block_alone(results):
    before, touched, after, free = ok(results, "PN0005_null_block_not_refcounted")
    assert before == touched == after
    assert free == 7  # 8 blocks, one is the null block


@pytest.mark.vllm_install
def test_pn0016_trim_null_head(results):
    assert ok(results, "PN0016_trim_null_head") == [[1, 2], [1, 2], [], [1, 0, 2]]


@pytest.mark.vllm_install
def test_pn0006_encoder_cache_keeps_repeated_item_until_last_occurrence(results):
    r = ok(results, "PN0006_encoder_cache_hash_refs")
    assert r["hit"] is True
    assert r["refs"] == {"A": 2, "B": 1}
    assert r["a_held"] is True and r["a_freed"] is True
    assert r["left"] == {} and r["free_slots"] == 100


@pytest.mark.vllm_install
def test_pn0007_ue8m0_scales_stay_powers_of_two(results):
    r = ok(results, "PN0007_ue8m0_scales_are_powers_of_two")
    assert r["positive"] and r["mantissa_bits_zero"], r["scales"]


@pytest.mark.vllm_install
def test_pn0018_refuses_mismatched_float_kv_cache(results):
    raised(results, "PN0018_float_kv_dtype_mismatch", "ValueError", 'kv_cache_dtype="float16"',
           'dtype="bfloat16"', "`auto` or `bfloat16`")
    assert ok(results, "PN0018_matching_dtype_ok") is None


@pytest.mark.vllm_install
def test_pn0022_step3_keeps_parameters_with_angle_brackets(results):
    name, params = ok(results, "PN0022_step3_param_with_angle_bracket")
    assert name == "run_code"
    assert params == {"code": "if a < b:\n    print(a)", "lang": "python"}
