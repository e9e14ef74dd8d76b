"""TurboQuant k8v4 store + decode kernels, on the CPU through Triton's interpreter.

Needs torch and triton (the ``[kernels]`` extra); skips cleanly without them.
vLLM's own kernels are run from the 0.32.0 source files (``.baselines/`` or the
sndr tree cache); those tests skip when the files are absent.

Decode tolerance, stated: against a float64 dequantize-then-attend reference
on the same cache bytes, with a float32 output, the relative Frobenius error
is below 2e-3 and the largest element error below 1e-2 of the largest
reference element. The error comes from the fp16 P*scale operand of the P@V
tensor-core dot (2**-11 relative); scores are exact up to fp32 accumulation
(fp8 keys and fp16/bf16 queries convert to fp16 exactly).
"""

from __future__ import annotations

import ast
import hashlib
import inspect
import os
import sys
import tomllib
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="torch not installed (install the [kernels] extra)")
if torch.cuda.is_available():
    # these run Triton through its CPU interpreter on CPU tensors; on a GPU the
    # kernels are checked by test_tq_cuda_gpu.py and bench_tq_decode.py --check
    pytest.skip("CPU-interpreter tests (a GPU is present)", allow_module_level=True)
else:
    # Triton picks interpreter or compiler when a function is decorated, i.e. at import
    if sys.modules.get("triton") is not None and os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
        pytest.skip("triton was imported before TRITON_INTERPRET=1 could be set; run this file alone", allow_module_level=True)
    os.environ.setdefault("TRITON_INTERPRET", "1")
try:
    import triton  # noqa: F401
except ImportError as exc:  # e.g. triton present but numpy (its interpreter needs it) missing
    pytest.skip(f"triton unavailable: {exc} (install the [kernels] extra)", allow_module_level=True)

from sndr.kernels.turboquant_k8v4 import (  # noqa: E402
    _interp,
    _vllm_baseline,
    cache_store,
    dispatch,
    kernels,
    reference,
    vllm_entry,
)
from sndr.kernels.turboquant_k8v4._layout import Layout  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
PATCH = REPO / "patches" / "PK0001-turboquant-k8v4-decode.toml"

if kernels.interpreting():
    _interp.fix_scalar_index()

# the interpreter evaluates log2(0) for an empty sequence's LSE (-inf, as intended)
pytestmark = pytest.mark.filterwarnings("ignore:divide by zero encountered in log2:RuntimeWarning")

REL_TOL = 2e-3
MAX_TOL = 1e-2


@pytest.fixture(scope="module")
def vllm_tq():
    src = _vllm_baseline.find_dir(REPO)
    if src is None:
        pytest.skip("vLLM 0.32.0 TurboQuant sources not found (.baselines/vllm032_tq or the sndr tree cache)")
    return _vllm_baseline.load(src)


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _random_cache(num_blocks, page, hk, d, gen):
    k = torch.randn(num_blocks, page, hk, d, generator=gen) * 2
    v = torch.randn(num_blocks, page, hk, d, generator=gen)
    return reference.pack(k, v)


# ----------------------------------------------------------------------------- layout + pack


@pytest.mark.parametrize("d,slot", [(64, 100), (128, 196), (256, 388)])
def test_layout_matches_vllm_turboquant_config(d, slot):
    # TurboQuantConfig(k8v4): key_packed_size = D, value_packed_size = ceil(D*4/8) + 4
    assert Layout(d).slot_size_aligned == slot == d + (d * 4 + 7) // 8 + 4


def test_fp8_encoder_matches_torch_on_every_bf16_value():
    import triton
    import triton.language as tl

    @triton.jit
    def enc(X, Y, N: tl.constexpr):
        i = tl.arange(0, N)
        tl.store(Y + i, cache_store._e4m3_rtne_bits(tl.load(X + i)))

    every = torch.arange(65536, dtype=torch.int32).to(torch.int16).view(torch.bfloat16).float()
    every = every[torch.isfinite(every)]
    edge = torch.tensor([447.9, 448.0, 449.0, 464.0, 480.0, 1e30, -1e30, 2.0**-10, 2.0**-9 * 1.5, 0.0, -0.0])
    x = torch.zeros(1 << 16)
    x[: every.numel()] = every
    x[-edge.numel():] = edge
    y = torch.empty(x.numel(), dtype=torch.uint8)
    enc[(1,)](x, y, N=x.numel())
    want = x.clamp(-448, 448).to(torch.float8_e4m3fn).view(torch.uint8)
    assert torch.equal(y, want)


@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_store_bit_exact_vs_reference(d, dtype):
    g = _gen(d)
    n, h, page, nb = 21, 3, 16, 4
    key = (torch.randn(n, h, d, generator=g) * 40).to(dtype)
    key[0, 0, :4] = torch.tensor([1000.0, -1000.0, 448.0, 1.9375])  # saturation and a rounding carry
    value = torch.randn(n, h, d, generator=g).to(dtype)
    value[1, 2] = 0.5  # constant vector: scale clamps to 1e-8
    slots = torch.randperm(nb * page, generator=g)[:n].to(torch.int32)
    slots[[3, 7]] = -1  # padding tokens are skipped
    garbage = torch.randint(0, 256, (nb, page, h, Layout(d).slot_size_aligned), generator=g, dtype=torch.uint8)
    got, want = garbage.clone(), garbage.clone()
    cache_store.store(key, value, got, slots)
    reference.store(key, value, want, slots)
    assert torch.equal(got, want)
    # the padding tokens' slots and the alignment byte kept their old contents
    untouched = torch.ones(nb * page, dtype=torch.bool)
    untouched[slots[slots >= 0].long()] = False
    flat_got, flat_old = got.view(nb * page, h, -1), garbage.view(nb * page, h, -1)
    assert torch.equal(flat_got[untouched], flat_old[untouched])


def test_pack_unpack_roundtrip():
    g = _gen(1)
    k = torch.randn(5, 2, 128, generator=g)
    v = torch.randn(5, 2, 128, generator=g)
    kk, vv = reference.unpack(reference.pack(k, v), 128)
    assert torch.equal(kk, k.to(torch.float8_e4m3fn).float())
    step = (v.amax(-1, keepdim=True) - v.amin(-1, keepdim=True)) / 15
    assert (vv - v).abs().le(step * 0.5 + 1e-2).all()


def test_store_byte_identical_to_vllm_store(vllm_tq):
    # Triton's interpreter mis-rounds fp32->fp8 casts (1.97 -> 1.0), and vLLM's
    # store uses that cast; keys already on the fp8 grid need no rounding, so
    # here both kernels must write the very same bytes. Arbitrary keys are
    # compared on the GPU by benchmarks/bench_tq_decode.py --check.
    d, n, h, page, nb = 128, 19, 2, 16, 3
    g = _gen(7)
    key = (torch.randn(n, h, d, generator=g) * 8).clamp(-448, 448).to(torch.float8_e4m3fn).float().to(torch.bfloat16)
    value = (torch.randn(n, h, d, generator=g) * 3).to(torch.bfloat16)
    slots = torch.randperm(nb * page, generator=g)[:n].to(torch.int32)
    slots[2] = -1
    ours = torch.zeros(nb, page, h, Layout(d).slot_size_aligned, dtype=torch.uint8)
    theirs = ours.clone()
    cache_store.store(key, value, ours, slots)
    vllm_tq.store(key, value, theirs, slots, torch.eye(d), torch.zeros(15), mse_bits=0,
                  key_packed_size=d, value_quant_bits=4, key_fp8=True)
    assert torch.equal(ours, theirs)


# ----------------------------------------------------------------------------- decode


def _check(out: torch.Tensor, ref: torch.Tensor):
    out = out.double()
    assert torch.isfinite(out).all()
    rel = ((out - ref).norm() / ref.norm().clamp_min(1e-30)).item()
    worst = ((out - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item()
    assert rel < REL_TOL and worst < MAX_TOL, (rel, worst)


@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("g_size", [1, 4, 6, 8])
def test_decode_vs_reference(d, g_size):
    gen = _gen(d * 10 + g_size)
    hk, page, b = 2, 16, 4
    hq = hk * g_size
    seq = torch.tensor([1, 37, 0, 203], dtype=torch.int32)  # one token, partial page, padding, several splits
    nb_per = 16
    cache = _random_cache(b * nb_per, page, hk, d, gen)
    bt = torch.randperm(b * nb_per, generator=gen)[: b * nb_per].reshape(b, nb_per).to(torch.int32)
    q = torch.randn(b, hq, d, generator=gen).to(torch.bfloat16)
    cfg = kernels.DecodeConfig(block_n=32 if d < 256 else 16, min_split_tokens=64, num_splits=4)
    out = torch.full((b, hq, d), float("nan"))
    lse = torch.full((b, hq), float("nan"))
    dispatch.decode_attention(q, cache, bt, seq, d**-0.5, out=out, lse=lse, config=cfg)
    ref = reference.decode(q, cache, bt, seq, d**-0.5)
    _check(out, ref)
    assert torch.equal(out[2], torch.zeros(hq, d))  # empty sequence -> zeros, not NaN
    assert torch.isneginf(lse[2]).all()
    # lse: log-sum-exp of the scaled scores of a non-empty sequence
    k, _ = reference.gather(cache, bt[3], 203, d)
    s = torch.einsum("hd,hld->hl", q[3].double(), k.double().repeat_interleave(g_size, 0)) * d**-0.5
    assert torch.allclose(lse[3].double(), torch.logsumexp(s, -1), atol=1e-3)


@pytest.mark.parametrize("page,block_n,prefetch", [(64, 32, True), (16, 64, False), (32, 32, True), (128, 64, False)])
def test_decode_page_tiling_and_prefetch(page, block_n, prefetch):
    # tiles of several pages, a page spanning several tiles, with and without the prefetch loop
    gen = _gen(page + block_n)
    d, hk, g_size, b, nbp = 64, 2, 4, 3, 6
    cache = _random_cache(b * nbp, page, hk, d, gen)
    bt = torch.randperm(b * nbp, generator=gen).reshape(b, nbp).to(torch.int32)
    seq = torch.tensor([nbp * page, 3, nbp * page - block_n - 5], dtype=torch.int32)
    q = torch.randn(b, hk * g_size, d, generator=gen).to(torch.bfloat16)
    out = torch.empty(b, hk * g_size, d)
    cfg = kernels.DecodeConfig(block_n=block_n, prefetch=prefetch, num_splits=3, min_split_tokens=block_n)
    dispatch.decode_attention(q, cache, bt, seq, d**-0.5, out=out, config=cfg)
    _check(out, reference.decode(q, cache, bt, seq, d**-0.5))


def test_split_count_depends_on_launch_shape_only(monkeypatch):
    cpu = torch.device("cpu")
    monkeypatch.setattr(kernels, "_sm_count", lambda device: 132)  # an H200
    waves = kernels.DecodeConfig(occupancy=2)  # two waves = 528 programs
    assert [kernels.pick_num_splits(b, 8, cpu, waves, 32) for b in (1, 8, 32, 64)] == [32, 8, 2, 1]
    assert kernels.pick_num_splits(8, 8, cpu, kernels.DecodeConfig(occupancy=3), 32) == 12
    assert kernels.pick_num_splits(1, 1, cpu, waves, 16) == 16  # vLLM's max_num_kv_splits caps it
    assert kernels.pick_num_splits(1, 8, cpu, kernels.DecodeConfig(num_splits=5), 32) == 5
    # the register cap is chosen where B*Hk lets 3 programs per SM fill whole waves
    assert kernels.default_config(128, 8, 64).maxnreg == 168
    assert kernels.default_config(128, 8, 512).maxnreg is None
    assert kernels.default_config(256, 4, 8).block_n == 32


def test_decode_default_config_fp16_output():
    gen = _gen(99)
    d, hk, g_size, page = 128, 1, 4, 16
    seq = torch.tensor([130, 64], dtype=torch.int32)
    cache = _random_cache(32, page, hk, d, gen)
    bt = torch.randperm(32, generator=gen).reshape(2, 16).to(torch.int32)
    q = torch.randn(2, hk * g_size, d, generator=gen).to(torch.float16)
    out = dispatch.decode_attention(q, cache, bt, seq, d**-0.5)
    assert out.dtype == torch.float16
    ref = reference.decode(q, cache, bt, seq, d**-0.5)
    rel = ((out.double() - ref).norm() / ref.norm()).item()
    assert rel < 2e-3  # fp16 output rounding adds 2**-11


def test_decode_large_values_stay_finite():
    # value scales far from 1 (and a constant vector with scale 1e-8 -> fp16 0)
    gen = _gen(5)
    d, hk, page = 64, 1, 16
    k = torch.randn(4, page, hk, d, generator=gen)
    v = torch.randn(4, page, hk, d, generator=gen) * 2e3  # zero and scale are fp16: |v| < 65504
    v[0, 0] = 7.0
    v[1, :3] *= 1e-6
    cache = reference.pack(k, v)
    bt = torch.arange(4, dtype=torch.int32).reshape(1, 4)
    seq = torch.tensor([64], dtype=torch.int32)
    q = torch.randn(1, 4, d, generator=gen).to(torch.bfloat16)
    out = torch.empty(1, 4, d)
    dispatch.decode_attention(q, cache, bt, seq, d**-0.5, out=out, config=kernels.DecodeConfig(block_n=16))
    _check(out, reference.decode(q, cache, bt, seq, d**-0.5))


def test_decode_matches_vllm_decode(vllm_tq):
    gen = _gen(11)
    d, hk, g_size, page, b = 128, 2, 4, 16, 2
    cache = _random_cache(16, page, hk, d, gen)
    bt = torch.randperm(16, generator=gen).reshape(b, 8).to(torch.int32)
    seq = torch.tensor([45, 128], dtype=torch.int32)
    q = torch.randn(b, hk * g_size, d, generator=gen).to(torch.bfloat16)
    theirs = vllm_tq.decode(q, cache, bt, seq, torch.eye(d), torch.zeros(1), d**-0.5, mse_bits=0,
                            key_packed_size=d, value_quant_bits=4, key_fp8=True, max_num_kv_splits=4)
    ours = dispatch.decode_attention(q, cache, bt, seq, d**-0.5, out=torch.empty(b, hk * g_size, d),
                                    config=kernels.DecodeConfig(block_n=32, min_split_tokens=32))
    assert ((ours - theirs.float()).norm() / theirs.float().norm()).item() < 5e-3  # theirs is bf16


# ----------------------------------------------------------------------------- the vLLM entry + patch


def test_entry_writes_vllm_buffers():
    gen = _gen(3)
    d, hk, g_size, page, b, splits = 64, 2, 4, 16, 3, 8
    hq = hk * g_size
    cache = _random_cache(24, page, hk, d, gen)
    bt = torch.randperm(24, generator=gen).reshape(b, 8).to(torch.int32)
    seq = torch.tensor([100, 1, 128], dtype=torch.int32)
    q = torch.randn(b, hq, d, generator=gen).to(torch.bfloat16)
    # what vLLM's workspace hands out: [B, Hq, S, D+1] fp32, [B, Hq, D], [B, Hq]
    mid = torch.empty(b, hq, splits, d + 1)
    out_buf = torch.full((b, hq, d), float("nan"), dtype=torch.bfloat16)
    lse_buf = torch.empty(b, hq)
    res = vllm_entry.decode(q, cache, bt, seq, torch.eye(d), torch.zeros(1), d**-0.5, 0, d, 4, key_fp8=True,
                            mid_o_buf=mid, output_buf=out_buf, lse_buf=lse_buf, max_num_kv_splits=splits)
    assert res.data_ptr() == out_buf.data_ptr()
    ref = reference.decode(q, cache, bt, seq, d**-0.5)
    assert ((res.double() - ref).norm() / ref.norm()).item() < 6e-3  # bf16 output


def test_entry_falls_back_to_vllm_for_other_presets(monkeypatch):
    calls = []
    monkeypatch.setitem(vllm_entry._FALLBACK, "fn", lambda *a, **k: calls.append((a, k)) or "vllm")
    q = torch.zeros(1, 4, 128, dtype=torch.bfloat16)
    cache = torch.zeros(2, 16, 1, 196, dtype=torch.uint8)
    args = (q, cache, torch.zeros(1, 2, dtype=torch.int32), torch.ones(1, dtype=torch.int32), torch.eye(128), torch.zeros(16), 0.1)
    assert vllm_entry.decode(*args, 4, 66, 4, key_fp8=False, norm_correction=True) == "vllm"  # 4bit_nc: MSE keys
    assert vllm_entry.decode(*args, 0, 128, 3, key_fp8=True) == "vllm"  # 3-bit values
    assert calls[0][1]["norm_correction"] is True and calls[1][1]["max_num_kv_splits"] == 32


def test_entry_signature_and_binding_pins_match_vllm(vllm_tq):
    patch = tomllib.loads(PATCH.read_text())
    # measured (docs/bench-tq-decode-h200.md): beats vLLM in every cell, so on by default (issue 28)
    assert patch["kind"] == "plugin" and patch["lifecycle"] == "active" and patch["default"] is True
    (edit,) = patch["runtime"]
    assert edit["replacement"] == "sndr.kernels.turboquant_k8v4:decode"
    theirs = vllm_tq.decode
    # the entry binds every call site exactly as vLLM's function does, annotations included
    assert str(inspect.signature(vllm_entry.decode)) == str(inspect.signature(theirs))
    from sndr.binding import signature_of_callable  # the form sndr's binding check compares

    assert signature_of_callable(vllm_entry.decode) == signature_of_callable(theirs) == edit["signature"]
    src = Path(vllm_tq.modules["triton_turboquant_decode"].__file__).read_text()
    (node,) = [n for n in ast.parse(src).body if isinstance(n, ast.FunctionDef) and n.name == theirs.__name__]
    assert hashlib.sha256(ast.get_source_segment(src, node).encode()).hexdigest() == edit["source_sha256"]


def test_patch_file_validates_against_model():
    from sndr.model import Patch

    Patch.model_validate(tomllib.loads(PATCH.read_text()))


@pytest.mark.parametrize("version", ["0.32.0", "0.33.0"])
def test_binding_check_applies_on_pinned_trees(version):
    from sndr.binding import check_binding

    root = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "sndr" / "trees" / f"vllm-{version}"
    if not (root / "vllm").is_dir():
        pytest.skip(f"vLLM {version} tree not in the sndr cache")
    (edit,) = tomllib.loads(PATCH.read_text())["runtime"]

    class Edit:
        target = edit["target"]
        signature = edit["signature"]
        source_sha256 = edit["source_sha256"]

    def read(rel):
        p = root / rel
        return p.read_text() if p.is_file() else None

    verdict, reason, _ = check_binding(Edit, read)
    assert verdict == "applies", reason
