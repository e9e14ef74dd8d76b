"""PG0001 (KV cache layout check) and PG0008 (MSE presets need a power-of-two head size).

Runs the patched TurboQuant backend of vLLM 0.32.0 on the CPU install: the
guards run before any kernel, so they can be exercised without a GPU.
"""

from __future__ import annotations

import pytest

from .conftest import ok, raised, run_cases

pytestmark = pytest.mark.vllm_install

SCRIPT = r'''
import inspect
from types import SimpleNamespace

import torch

import vllm.v1.attention.backends.turboquant_attn as tq
from vllm.model_executor.layers.quantization.turboquant.config import TurboQuantConfig

PRESET = "turboquant_4bit_nc"
cfg = TurboQuantConfig.from_cache_dtype(PRESET, 128)
SLOT = cfg.slot_size_aligned
good = torch.zeros(4, 16, 2, SLOT, dtype=torch.uint8)  # (blocks, block_size, Hk, slot)
check = tq._sndr_check_tq_kv_cache

@case("good_cache")
def _():
    return check(good, cfg, 2, PRESET, "attention")

@case("placeholder_cache")
def _():
    return check(torch.empty(0, dtype=torch.bfloat16), cfg, 2, PRESET, "attention")

@case("bf16_cache")
def _():
    check(torch.zeros(4, 16, 2, SLOT // 2, dtype=torch.bfloat16), cfg, 2, PRESET, "attention")

@case("rank3_cache")
def _():
    check(good.view(4, 16, -1), cfg, 2, PRESET, "attention")

@case("wrong_heads")
def _():
    check(good, cfg, 4, PRESET, "attention")

@case("narrow_slot")
def _():
    check(good[..., : cfg.slot_size - 1], cfg, 2, PRESET, "KV cache update")

@case("strided_slot")
def _():
    check(torch.zeros(4, 16, 2, 2 * SLOT, dtype=torch.uint8)[..., ::2], cfg, 2, PRESET, "attention")

def bare_impl(head_size=128, num_kv_heads=2):
    impl = object.__new__(tq.TurboQuantAttentionImpl)
    impl.num_heads, impl.head_size, impl.num_kv_heads = 4, head_size, num_kv_heads
    impl.kv_cache_dtype, impl.tq_config = PRESET, cfg
    impl._soa_store = False
    return impl

@case("forward_rejects_bf16_cache")
def _():
    impl = bare_impl()
    q = torch.zeros(1, 4 * 128)
    kv = torch.zeros(4, 2, 16, SLOT // 2, dtype=torch.bfloat16)  # (B, H, N, C) as the layer holds it
    impl.forward(SimpleNamespace(), q, q, q, kv, SimpleNamespace(num_actual_tokens=1))

@case("kv_update_rejects_narrow_slot")
def _():
    impl = bare_impl()
    kv = torch.zeros(4, 2, 16, cfg.slot_size - 1, dtype=torch.uint8)
    k = torch.zeros(1, 2 * 128)
    impl.do_kv_cache_update(SimpleNamespace(_tq_cached=True), k, k, kv, torch.zeros(1, dtype=torch.int64))

@case("head_size_96_mse")
def _():
    tq._sndr_check_tq_head_size(TurboQuantConfig.from_cache_dtype(PRESET, 96), 96, PRESET)

@case("head_size_96_k8v4")
def _():
    return tq._sndr_check_tq_head_size(TurboQuantConfig.from_cache_dtype("turboquant_k8v4", 96), 96, "turboquant_k8v4")

@case("head_size_128_mse")
def _():
    return tq._sndr_check_tq_head_size(cfg, 128, PRESET)

@case("impl_refuses_head_size_96")
def _():
    tq.TurboQuantAttentionImpl(num_heads=8, head_size=96, scale=0.1, num_kv_heads=8, kv_cache_dtype=PRESET)

@case("hadamard_96_is_not_96x96")
def _():
    # Why PG0008 exists: the Sylvester construction has no 96x96 matrix.
    return list(tq._build_hadamard(96, "cpu").shape)
'''


@pytest.fixture(scope="module")
def results(vllm_py, patched_pin_root):
    return run_cases(vllm_py, SCRIPT, patched_pin_root)


def test_valid_cache_and_profiling_placeholder_pass(results):
    assert ok(results, "good_cache") is None
    assert ok(results, "placeholder_cache") is None


@pytest.mark.parametrize("case,fragments", [
    ("bf16_cache", ["torch.bfloat16", "expected torch.uint8"]),
    ("rank3_cache", ["rank 3", "expected 4"]),
    ("wrong_heads", ["has 2 heads in dim 2", "4 KV heads"]),
    ("narrow_slot", ["KV cache update", "turboquant_4bit_nc", "packs"]),
    ("strided_slot", ["stride 2", "contiguous"]),
])
def test_bad_cache_is_refused_with_the_reason(results, case, fragments):
    raised(results, case, "ValueError", "TurboQuant", *fragments)


def test_guard_is_wired_into_forward_and_kv_update(results):
    raised(results, "forward_rejects_bf16_cache", "ValueError", "TurboQuant attention", "torch.bfloat16")
    raised(results, "kv_update_rejects_narrow_slot", "ValueError", "TurboQuant KV cache update", "slot")


def test_mse_preset_refuses_non_power_of_two_head_size(results):
    raised(results, "head_size_96_mse", "ValueError", "head_size=96", "turboquant_k8v4")
    raised(results, "impl_refuses_head_size_96", "ValueError", "head_size=96", "power-of-two")
    assert ok(results, "head_size_96_k8v4") is None
    assert ok(results, "head_size_128_mse") is None
    assert ok(results, "hadamard_96_is_not_96x96") == [128, 128]
