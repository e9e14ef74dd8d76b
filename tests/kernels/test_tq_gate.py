"""PK0001's gate, on the CPU: which vLLM TurboQuant decode calls sndr's CUDA kernels take.

The rule (``dispatch.gate``): the k8v4 preset (fp8 keys, 4-bit values), an
NVIDIA GPU of sm_89 or newer, head dim 64 or 128 (256 with the page kernel:
sm_90 and a cache TMA can copy), pages of a multiple of 16 tokens, 1..16 query
heads per KV head, fp16/bf16 queries. Everything else runs vLLM's own kernel;
sndr's Triton kernel runs only when ``SNDR_TQ_BACKEND=triton`` asks for it.
"""

from __future__ import annotations

import itertools

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from sndr.kernels.turboquant_k8v4 import dispatch  # noqa: E402

HEAD_DIMS = (32, 64, 96, 128, 192, 256, 512)
PAGES = (8, 16, 24, 32, 48, 64, 128, 528)
GROUPS = ((8, 8), (32, 8), (64, 8), (48, 8), (128, 8), (136, 8), (24, 2), (6, 1), (16, 1), (17, 1), (12, 8), (8, 0))
QDTYPES = (torch.float16, torch.bfloat16, torch.float32)
CAPS = (None, (7, 5), (8, 0), (8, 6), (8, 9), (9, 0), (10, 0), (12, 0))
PRESETS = ((True, 4), (True, 3), (False, 4), (False, 3))  # (key_fp8, value_quant_bits): k8v4 is (True, 4)


def expected(d, page, hq, hk, qdtype, key_fp8, vqb, cap, page_kernel_ok) -> str:
    k8v4 = key_fp8 and vqb == 4
    gpu = cap is not None and cap >= (8, 9)
    dim = d in (64, 128) or (d == 256 and cap is not None and cap >= (9, 0) and page_kernel_ok)
    group = hk > 0 and hq % hk == 0 and 1 <= hq // hk <= 16
    ok = k8v4 and gpu and dim and page % 16 == 0 and group and qdtype in (torch.float16, torch.bfloat16)
    return "cuda" if ok else "vllm"


def test_gate_picks_exactly_the_covered_configs():
    n_cuda = 0
    for d, page, (hq, hk), qdtype, cap, (fp8, vqb), pk in itertools.product(
            HEAD_DIMS, PAGES, GROUPS, QDTYPES, CAPS, PRESETS, (True, False)):
        got = dispatch.gate(head_dim=d, page=page, hq=hq, hk=hk, qdtype=qdtype, key_fp8=fp8, value_quant_bits=vqb,
                            key_packed_size=d, capability=cap, page_kernel_ok=pk)
        want = expected(d, page, hq, hk, qdtype, fp8, vqb, cap, pk)
        assert got == want, (d, page, hq, hk, qdtype, cap, fp8, vqb, pk)
        n_cuda += got == "cuda"
    assert n_cuda > 0


def test_gate_sends_mse_key_presets_to_vllm_whatever_the_shape():
    for d, cap in itertools.product((64, 128, 256), ((8, 9), (9, 0))):
        assert dispatch.gate(head_dim=d, page=16, hq=32, hk=8, qdtype=torch.bfloat16, key_fp8=False,
                             value_quant_bits=4, key_packed_size=d // 2 + 2, capability=cap) == "vllm"


def test_backend_variable_cuda_raises_where_not_covered_and_triton_opts_in():
    common = dict(page=16, hk=8, qdtype=torch.bfloat16, key_fp8=True, value_quant_bits=4, capability=(9, 0))
    assert dispatch.gate(head_dim=128, hq=32, key_packed_size=128, backend="cuda", **common) == "cuda"
    with pytest.raises(ValueError, match="SNDR_TQ_BACKEND=cuda: head dim 32"):
        dispatch.gate(head_dim=32, hq=32, key_packed_size=32, backend="cuda", **common)
    # Triton only on request, and only for k8v4 shapes it takes
    assert dispatch.gate(head_dim=128, hq=32, key_packed_size=128, backend="triton", **common) == "triton"
    assert dispatch.gate(head_dim=32, hq=32, key_packed_size=32, backend="triton", **common) == "triton"
    assert dispatch.gate(head_dim=128, hq=256, key_packed_size=128, backend="triton", **common) == "vllm"
    assert dispatch.gate(head_dim=32, hq=32, key_packed_size=32, backend="auto", **common) == "vllm"


def test_on_by_default_the_cuda_kernels_run_on_the_measured_capability_only():
    """PK0001 on by default (no SNDR_ENABLE_PK0001=1): sm_90, where every benchmark cell beats vLLM;
    elsewhere vLLM's kernel, with the reason the entry logs once. An explicit opt-in covers sm_89+."""
    common = dict(head_dim=128, page=16, hq=32, hk=8, qdtype=torch.bfloat16, key_fp8=True, value_quant_bits=4,
                  key_packed_size=128)
    assert dispatch.gate_why(capability=(9, 0), explicit=False, **common) == ("cuda", "")
    for cap in ((8, 9), (10, 0), (12, 0)):
        verdict, why = dispatch.gate_why(capability=cap, explicit=False, **common)
        assert verdict == "vllm" and "outside the measured default set" in why and "SNDR_ENABLE_PK0001=1" in why
        assert dispatch.gate_why(capability=cap, explicit=True, **common) == ("cuda", "")
    assert dispatch.gate_why(capability=(8, 0), explicit=True, **common)[1].startswith("sm_80")
    assert dispatch.gate_why(capability=None, **common) == ("vllm", "not an NVIDIA CUDA device")


def test_explicit_opt_in_reads_the_plugins_own_variable(monkeypatch):
    monkeypatch.delenv("SNDR_ENABLE_PK0001", raising=False)
    assert dispatch.explicit_opt_in() is False
    monkeypatch.setenv("SNDR_ENABLE_PK0001", "1")
    assert dispatch.explicit_opt_in() is True
    monkeypatch.setenv("SNDR_ENABLE_PK0001", "bogus")  # refused at startup; the default scope here
    assert dispatch.explicit_opt_in() is False


def test_vllm_entry_sends_uncovered_k8v4_calls_to_vllm(monkeypatch):
    """On the CPU the entry runs Triton's interpreter for covered k8v4 calls;
    presets and shapes the gate refuses reach vLLM's function untouched."""
    from sndr.kernels.turboquant_k8v4 import vllm_entry

    calls = []
    monkeypatch.setitem(vllm_entry._FALLBACK, "fn", lambda *a, **k: calls.append(k) or "vllm")
    q = torch.zeros(1, 4, 96, dtype=torch.bfloat16)  # head dim 96: no power of two
    cache = torch.zeros(2, 16, 1, 148, dtype=torch.uint8)
    args = (q, cache, torch.zeros(1, 2, dtype=torch.int32), torch.ones(1, dtype=torch.int32),
            torch.eye(96), torch.zeros(16), 0.1, 0, 96, 4)
    assert vllm_entry.decode(*args, key_fp8=True) == "vllm"
    assert len(calls) == 1 and calls[0]["key_fp8"] is True
