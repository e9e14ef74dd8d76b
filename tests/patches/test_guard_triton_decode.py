"""PG0007: the Triton decode wrapper validates shapes before launching its kernels."""

from __future__ import annotations

import pytest

from .conftest import ok, raised, run_cases

pytestmark = pytest.mark.vllm_install

SCRIPT = r'''
import torch
from vllm.v1.attention.ops import triton_decode_attention as tda

B, H, D, LV, SPLITS = 2, 16, 576, 512, 4

def args(**over):
    a = dict(
        q=torch.zeros(B, H, D),
        k_buffer=torch.zeros(8, 16, 1, D),
        v_buffer=torch.zeros(8, 16, 1, LV),
        o=torch.zeros(B, H, LV),
        lse=torch.zeros(B, H),
        req_to_token=torch.zeros(B, 4, dtype=torch.int32),
        b_seq_len=torch.ones(B, dtype=torch.int32),
        attn_logits=torch.zeros(B, H, SPLITS, LV + 1),
        num_kv_splits=SPLITS,
        sm_scale=0.1,
    )
    a.update(over)
    return a

def check(**over):
    a = args(**over)
    return tda._sndr_check_decode_shapes(a["q"], a["v_buffer"], a["o"], a["req_to_token"], a["b_seq_len"],
                                         a["attn_logits"], a["num_kv_splits"])

@case("mla_shapes_pass")
def _():
    return check()

@case("heads_not_multiple")
def _():
    return check(q=torch.zeros(B, 12, D), v_buffer=torch.zeros(8, 16, 8, LV), o=torch.zeros(B, 12, LV),
                 attn_logits=torch.zeros(B, 12, SPLITS, LV + 1))

@case("short_seq_lens")
def _():
    return check(b_seq_len=torch.ones(1, dtype=torch.int32))

@case("small_scratch")
def _():
    return check(attn_logits=torch.zeros(1, H, SPLITS, LV + 1))

@case("narrow_scratch")
def _():
    return check(attn_logits=torch.zeros(B, H, SPLITS, LV))

@case("entry_point_checks")
def _():
    # the real entry point; the check fires before any kernel launch
    tda.decode_attention_fwd(**args(b_seq_len=torch.ones(1, dtype=torch.int32)))
'''


@pytest.fixture(scope="module")
def results(vllm_py, patched_pin_root):
    return run_cases(vllm_py, SCRIPT, patched_pin_root)


def test_triton_mla_shapes_pass(results):
    assert ok(results, "mla_shapes_pass") is None


@pytest.mark.parametrize("case,fragments", [
    ("heads_not_multiple", ["12 query heads", "8 KV heads"]),
    ("short_seq_lens", ["2 query rows", "b_seq_len has 1"]),
    ("small_scratch", ["smaller than (2, 16, 4, 513)"]),
    ("narrow_scratch", ["smaller than"]),
    ("entry_point_checks", ["b_seq_len has 1"]),
])
def test_bad_shapes_are_refused(results, case, fragments):
    raised(results, case, "ValueError", "decode attention", *fragments)
