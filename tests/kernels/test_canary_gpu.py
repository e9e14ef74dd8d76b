"""PK0001 / PK0002 canaries on a real GPU: the real kernels pass, an injected wrong kernel is caught.

Skipped without CUDA (sm_89+). Run on the H200 through the device tool:

    python3 -m pytest tests/kernels/test_canary_gpu.py -q -s

-s prints each canary's verdict and its cold / warm cost (not asserted: benchmarks/bench_canary.py).
"""

from __future__ import annotations

import time

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9):
    pytest.skip("needs a CUDA GPU with sm_89+", allow_module_level=True)

from sndr.kernels import canary as generic  # noqa: E402
from sndr.kernels.turboquant_k8v4 import canary, dispatch, reference  # noqa: E402
from sndr.startup.runtime import StrictError  # noqa: E402

pytestmark = pytest.mark.gpu
CAP = torch.cuda.get_device_capability()


@pytest.fixture(autouse=True)
def fresh(tmp_path, monkeypatch):
    monkeypatch.setenv("SNDR_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("SNDR_ENABLE_PK0001", "1")  # the whole covered set, not only the measured default
    monkeypatch.delenv("SNDR_STRICT", raising=False)
    generic.reset()
    canary.reset()
    yield
    generic.reset()
    canary.reset()


def _call(hq, hk, d, page, dtype):
    q = torch.empty(1, hq, d, dtype=dtype, device="cuda")
    kv = torch.empty(1, page, hk, reference.Layout(d).slot_size_aligned, dtype=torch.uint8, device="cuda")
    return q, kv


SHAPES = [(32, 8, 128, 16, torch.bfloat16), (64, 8, 128, 16, torch.bfloat16), (8, 8, 64, 16, torch.float16),
          (16, 1, 128, 32, torch.bfloat16)]
if CAP >= (9, 0):
    SHAPES.append((16, 4, 256, 16, torch.bfloat16))


@pytest.mark.parametrize("hq,hk,d,page,dtype", SHAPES)
def test_the_real_decode_kernel_passes_and_the_pass_is_cached(hq, hk, d, page, dtype):
    q, kv = _call(hq, hk, d, page, dtype)
    t0 = time.perf_counter()
    assert canary.decode_ok(q, kv, "cuda"), generic.results()
    cold = (time.perf_counter() - t0) * 1000
    (r,) = generic.results()
    assert r["status"] == generic.PASSED and not r["cached"], r
    canary._OK.clear()
    generic.reset()  # a new process
    t0 = time.perf_counter()
    assert canary.decode_ok(q, kv, "cuda")
    warm = (time.perf_counter() - t0) * 1000
    (r2,) = generic.results()
    assert r2["cached"], r2
    print(f"\nPK0001 {r['config']} on {r['device']}: {r['why']}; cold {cold:.1f} ms (build included), "
          f"warm {warm:.2f} ms")


@pytest.mark.skipif(CAP < (9, 0), reason="the verify kernel needs sm_90 (sm_89: synthetic rows)")
@pytest.mark.parametrize("hq,k", [(32, 1), (32, 3), (64, 3), (32, 5)])
def test_the_real_verify_kernel_passes(hq, k):
    assert canary.verify_ok(0, torch.bfloat16, hq, 8, 128, 16, k), generic.results()
    (r,) = generic.results()
    print(f"\nPK0002 {r['config']}: {r['why']} ({r['ms']:.1f} ms)")


def _wrong(monkeypatch):
    real = dispatch._try_cuda

    def off_by_a_bit(q, kv, bt, sl, scale, out, lse, ws, splits):
        done = real(q, kv, bt, sl, scale, out, lse, ws, splits)
        done[:, 0] *= 1.25  # one head of every request 25% off
        return done

    monkeypatch.setattr(dispatch, "_try_cuda", off_by_a_bit)


def test_an_injected_wrong_kernel_is_caught_on_the_gpu(monkeypatch, capsys):
    _wrong(monkeypatch)
    q, kv = _call(32, 8, 128, 16, torch.bfloat16)
    assert not canary.decode_ok(q, kv, "cuda")
    (r,) = generic.results()
    assert r["status"] == generic.FAILED and r["why"].startswith("mismatch"), r
    assert torch.cuda.get_device_name(0) in capsys.readouterr().err
    assert not canary.decode_ok(q, kv, "cuda")  # the verdict stands for the process


def test_strict_refuses_on_the_gpu(monkeypatch):
    _wrong(monkeypatch)
    monkeypatch.setenv("SNDR_STRICT", "1")
    q, kv = _call(32, 8, 128, 16, torch.bfloat16)
    with pytest.raises(StrictError, match="PK0001 canary_failed"):
        canary.decode_ok(q, kv, "cuda")


def test_the_first_call_inside_a_capture_is_skipped_not_failed():
    q, kv = _call(32, 8, 128, 16, torch.bfloat16)
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s), torch.cuda.graph(g, stream=s):
        ok = canary.decode_ok(q, kv, "cuda")
    assert not ok
    assert generic.results() == []  # transient: nothing remembered; the next eager call runs the canary
    assert canary.decode_ok(q, kv, "cuda")
