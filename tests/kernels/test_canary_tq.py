"""PK0001 / PK0002 canary problems on the CPU: the fixed problems tell a right kernel from a wrong one.

Stand-in kernels: the float64 reference itself (right), and kernels with one
realistic bug each (a dropped softmax scale, the last KV token skipped, heads
mapped to the wrong KV head, the verify rows' causal limit ignored). Every
wrong one must exceed the tolerance by a wide margin; the right one and sndr's
own Triton kernel (CPU interpreter) must pass. The GPU run of the same
canaries through the real kernels: tests/kernels/test_canary_gpu.py.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from sndr.kernels import canary as generic  # noqa: E402
from sndr.kernels.turboquant_k8v4 import canary, reference  # noqa: E402

SHAPE = dict(hq=8, hk=2, d=64, page=16, qdtype=torch.bfloat16)


def right(q, kv, bt, sl, scale):
    return reference.decode(q, kv, bt, sl, scale).to(q.dtype)


def no_scale(q, kv, bt, sl, scale):
    return reference.decode(q, kv, bt, sl, 1.0).to(q.dtype)


def short_by_one(q, kv, bt, sl, scale):
    return reference.decode(q, kv, bt, (sl - 1).clamp_min(1), scale).to(q.dtype)


def wrong_head_map(q, kv, bt, sl, scale):
    g = q.shape[1] // kv.shape[2]
    perm = torch.arange(q.shape[1]).view(-1, g).t().reshape(-1)  # h -> KV head h % Hk, not h // G
    out = reference.decode(q[:, perm], kv, bt, sl, scale)
    return out[:, torch.argsort(perm)].to(q.dtype)


def test_the_right_kernel_passes_with_room():
    err, tol = canary.decode_check(right, **SHAPE)
    assert err < tol / 4, err


@pytest.mark.parametrize("wrong", [no_scale, short_by_one, wrong_head_map])
def test_each_injected_bug_is_caught(wrong):
    err, tol = canary.decode_check(wrong, **SHAPE)
    assert err > 2 * tol, (wrong.__name__, err)


def test_the_verify_problem_catches_a_kernel_without_the_causal_limit():
    def right_v(q, kv, bt, sl, scale, k):
        return reference.spec_verify(q, kv, bt, sl, scale, k).to(q.dtype)

    def no_causal(q, kv, bt, sl, scale, k):
        n, hq, d = q.shape
        b = n // (k + 1)
        rows = reference.decode(q, kv, bt[:b].repeat_interleave(k + 1, 0), sl[:b].repeat_interleave(k + 1), scale)
        return rows.to(q.dtype)

    args = dict(SHAPE, num_spec=3)
    err, tol = canary.verify_check(right_v, **args)
    assert err < tol / 4
    err, tol = canary.verify_check(no_causal, **args)
    assert err > 2 * tol, err


def test_the_verify_problem_runs_each_request_alone_too():
    """Below 17 query rows per KV head the CUDA verify kernel depends on the batch size (verify_wg.SMALL_BATCH): a
    kernel right on the whole batch and wrong on a batch of one request is caught."""
    def right_v(q, kv, bt, sl, scale, k):
        return reference.spec_verify(q, kv, bt, sl, scale, k).to(q.dtype)

    def wrong_alone(q, kv, bt, sl, scale, k):
        out = right_v(q, kv, bt, sl, scale, k)
        return out if sl.shape[0] > 1 else out * 1.5

    batches = []

    def seen(q, kv, bt, sl, scale, k):
        batches.append(sl.shape[0])
        return right_v(q, kv, bt, sl, scale, k)

    args = dict(SHAPE, num_spec=3)
    assert canary.verify_check(seen, **args)[0] < canary.TOLERANCE / 4
    assert batches == [3, 1, 1, 1]
    err, tol = canary.verify_check(wrong_alone, **args)
    assert err > 2 * tol, err


def test_sndrs_triton_kernel_passes_the_decode_canary_on_the_interpreter():
    from sndr.kernels.turboquant_k8v4 import kernels

    if not kernels.interpreting():
        pytest.skip("a GPU is present: tests/kernels/test_canary_gpu.py runs the real kernels")
    err, tol = canary.decode_check(lambda q, kv, bt, sl, s: kernels.triton_decode_attention(q, kv, bt, sl, s),
                                   **SHAPE)
    assert err < tol / 4, err


def test_a_wrong_kernel_through_check_is_canary_failed(tmp_path, monkeypatch):
    monkeypatch.setenv("SNDR_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("SNDR_STRICT", raising=False)
    generic.reset()
    ident = {"gpu": "stand-in", "driver": "0", "cuda": "0"}
    r = generic.check("PK0001", "stand-in", device="cpu stand-in", identity=ident, kernel_hash=canary.kernel_hash(),
                      run=lambda: canary.decode_check(short_by_one, **SHAPE))
    assert r.status == generic.FAILED and "mismatch" in r.why
    r = generic.check("PK0001", "stand-in 2", device="cpu stand-in", identity=ident, kernel_hash=canary.kernel_hash(),
                      run=lambda: canary.decode_check(right, **SHAPE))
    assert r.status == generic.PASSED
    generic.reset()


def test_the_kernel_hash_covers_the_cuda_sources_and_the_launch_code():
    from pathlib import Path

    here = Path(canary.__file__).parent
    names = {p.name for p in here.iterdir() if p.suffix in (".cu", ".py")}
    assert {"decode_k8v4.cu", "verify_k8v4.cu", "cuda_decode.py", "mtp_verify.py", "dispatch.py"} <= names
    assert len(canary.kernel_hash()) == 64
