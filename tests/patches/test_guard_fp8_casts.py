"""PG0003: FP8 casts saturate instead of turning out-of-range activations into NaN.

The CPU install runs on float8_e4m3fn; the ROCm dtype float8_e4m3fnuz (no
infinity, overflow -> NaN) is exercised by pointing the module's platform at
it, which is what ``current_platform.fp8_dtype()`` returns on MI300.
"""

from __future__ import annotations

import pytest

from .conftest import ok, run_cases

pytestmark = pytest.mark.vllm_install

SCRIPT = r'''
import inspect
from types import SimpleNamespace

import torch

import vllm.kernels.triton.qkv_padded_fp8_quant as vit
import vllm.v1.attention.backends.mla.rocm_aiter_mla as aiter_mla

FNUZ = torch.float8_e4m3fnuz
fin = torch.finfo(FNUZ)
x = (torch.linspace(-1000, 1000, 2 * 4 * 32)).reshape(2, 4, 32).to(torch.bfloat16)  # (S, H, D), D % 16 == 0

def stats(t):
    f = t.float()
    return {"dtype": str(t.dtype), "nan": int(f.isnan().sum()), "max": float(f.nan_to_num(0).abs().max())}

@case("bare_cast_makes_nan")
def _():
    return stats(x.to(FNUZ))  # what vLLM 0.32.0 does on these paths

@case("vit_skip_scale_saturates")
def _():
    vit.current_platform = SimpleNamespace(fp8_dtype=lambda: FNUZ)
    vit._FP8_MIN, vit._FP8_MAX = fin.min, fin.max
    return stats(vit.quantize_fp8_maybe_pad_head_dim(x, torch.ones(()), None, skip_scale=True))

@case("aiter_cast_saturates")
def _():
    return stats(aiter_mla._sndr_saturating_fp8_cast(x, FNUZ))

@case("aiter_cast_keeps_fp8_input")
def _():
    y = x.to(torch.float8_e4m3fn)
    return aiter_mla._sndr_saturating_fp8_cast(y, torch.float8_e4m3fn) is y

@case("aiter_prefill_uses_it")
def _():
    src = inspect.getsource(aiter_mla)
    return {"calls": src.count("_sndr_saturating_fp8_cast(q, fp8_dtype)"),
            "bare": src.count("q = q.to(fp8_dtype)")}
'''


@pytest.fixture(scope="module")
def results(vllm_py, patched_pin_root):
    return run_cases(vllm_py, SCRIPT, patched_pin_root)


def test_bare_fnuz_cast_is_the_problem(results):
    assert ok(results, "bare_cast_makes_nan")["nan"] > 0


def test_vit_quant_saturates(results):
    s = ok(results, "vit_skip_scale_saturates")
    assert s["dtype"] == "torch.float8_e4m3fnuz" and s["nan"] == 0 and s["max"] == 240.0


def test_aiter_mla_prefill_cast_saturates(results):
    s = ok(results, "aiter_cast_saturates")
    assert s["nan"] == 0 and s["max"] == 240.0
    assert ok(results, "aiter_cast_keeps_fp8_input") is True
    assert ok(results, "aiter_prefill_uses_it") == {"calls": 1, "bare": 0}
