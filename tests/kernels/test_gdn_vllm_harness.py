"""sndr's GDN drop-ins against vLLM 0.32.0's own two kernels, on the same inputs.

vLLM's ``fused_recurrent_gated_delta_rule_packed_decode`` and
``fused_sigmoid_gating_delta_rule_update`` are run from verbatim copies of
``vllm/third_party/flash_linear_attention/ops/{fused_recurrent,fused_sigmoid_gating}.py``
in ``.baselines/vllm032_gdn`` (git-ignored, never committed; make them with
``python -m sndr.kernels.gdn._vllm_baseline --from <site-packages or wheel>``).
Without the copies every test here skips, saying so. The copies' function
sources must hash to PK0003's pinned ``source_sha256``, so the baseline is the
code the patch replaces.

On the CPU both sides run under Triton's interpreter (small shapes); on a GPU
compiled, with the 35B-A3B head shape. Both start from the same state pool;
the outputs of every non-padded token and the whole pool afterwards are
compared (relative Frobenius error; bit-equal for slots neither writes).
Stated tolerance: 1e-5 with a float32 pool and float32 outputs; with bf16
outputs or a bf16 pool, 4e-3 relative (both kernels round to bf16, from fp32
values computed in a different order, so a value near a rounding boundary
may land one bf16 ulp apart).
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="torch not installed (install the [kernels] extra)")
pytest.importorskip("triton", reason="triton unavailable (install the [kernels] extra)")
CUDA = torch.cuda.is_available()

from sndr.kernels.gdn import _vllm_baseline, routing, vllm_entry  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
PATCH = REPO / "patches" / "PK0003-gdn-decode-kernels.toml"
SRC = _vllm_baseline.find_dir(REPO)
if SRC is None:
    pytest.skip("vLLM 0.32.0's GDN kernels are not copied into .baselines/vllm032_gdn "
                "(python -m sndr.kernels.gdn._vllm_baseline --from <site-packages or wheel>)",
                allow_module_level=True)
VLLM = _vllm_baseline.load(SRC)
DEV = "cuda" if CUDA else "cpu"
if CUDA:
    H, HV, K, V, NS = 16, 32, 128, 128, (1, 8, 33)
    pytestmark = [pytest.mark.gpu, pytest.mark.triton_interpreter]
else:
    pytestmark = pytest.mark.triton_interpreter  # tests/kernels/conftest.py: its interpreter fix applied
    H, HV, K, V, NS = 2, 4, 32, 64, (3,)
BF = torch.bfloat16


@pytest.fixture(autouse=True)
def _every_cell():
    """On a GPU, sndr's Triton fallback entries run only with SNDR_ENABLE_PK0003=1, and the default-path
    entries only in the cells they win: the comparison with vLLM is the point here, so every call is taken."""
    with routing.measuring():
        yield


def rel(a, b):
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def tol(*dtypes):
    return 1e-5 if all(d == torch.float32 for d in dtypes) else 4e-3


def test_copies_are_the_pinned_sources():
    pinned = {r["target"].split(":")[1]: r["source_sha256"] for r in tomllib.loads(PATCH.read_text())["runtime"]}
    copied = _vllm_baseline.source_sha256(SRC)  # the two kernels the copies hold (the other entries are layer code)
    assert set(copied) == set(_vllm_baseline.FUNCTIONS) and copied == {fn: pinned[fn] for fn in copied}


def _inputs(n, t, state_dtype, act, seed):
    g = torch.Generator(device=DEV).manual_seed(seed)
    tok = n * t
    slots = tok + 2
    state = (torch.randn(slots, HV, V, K, generator=g, device=DEV) * 0.3).to(state_dtype)
    perm = torch.randperm(slots - 2, generator=g, device=DEV) + 2
    idx = perm.reshape(n, t).to(torch.int32)
    if n > 1:
        idx[1] = -1  # padding row (vLLM pads with -1; slot 0 is the NULL block)
    if n > 2:
        idx[-1, 0] = 0 if t == 1 else idx[-1, 0]
    num_acc = torch.randint(1, t + 1, (n,), generator=g, device=DEV, dtype=torch.int32)
    mk = lambda *s: torch.randn(*s, generator=g, device=DEV).to(act)  # noqa: E731
    return dict(state=state, idx=idx, num_acc=num_acc, q=mk(1, tok, H, K), k=mk(1, tok, H, K), v=mk(1, tok, HV, V),
                a=mk(tok, HV), b=mk(tok, HV), A_log=torch.rand(HV, generator=g, device=DEV) * 2 - 1,
                dt_bias=torch.rand(HV, generator=g, device=DEV) * 2 - 1,
                cu=torch.arange(0, tok + 1, t, device=DEV, dtype=torch.int32))


@pytest.mark.parametrize("n", NS)
@pytest.mark.parametrize("state_dtype,act", [(torch.float32, torch.float32), (torch.float32, BF), (BF, BF)])
def test_packed_decode_same_as_vllm(n, state_dtype, act):
    x = _inputs(n, 1, state_dtype, act, seed=n)
    tok = n
    mixed = torch.cat([x["q"].reshape(tok, -1), x["k"].reshape(tok, -1), x["v"].reshape(tok, -1)], 1)
    idx = x["idx"][:, 0].contiguous()
    s_v, s_s = x["state"].clone(), x["state"].clone()
    o_v = torch.empty(tok, 1, HV, V, device=DEV, dtype=act)
    o_s = torch.full_like(o_v, float("nan"))
    VLLM.packed_decode(mixed, x["a"], x["b"], x["A_log"], x["dt_bias"], K**-0.5, s_v, o_v, idx,
                       use_qk_l2norm_in_kernel=True)
    r = vllm_entry.try_packed_decode(mixed, x["a"], x["b"], x["A_log"], x["dt_bias"], K**-0.5, s_s, o_s, idx, True)
    assert r is not None
    assert torch.equal(o_s[idx <= 0], o_v[idx <= 0])  # both write zeros for padding rows
    assert rel(o_s, o_v) <= tol(state_dtype, act)
    assert rel(s_s, s_v) <= tol(state_dtype)
    untouched = [s for s in range(s_v.shape[0]) if s not in set(idx.tolist())]
    assert torch.equal(s_s[untouched], s_v[untouched])


@pytest.mark.parametrize("n", NS)
@pytest.mark.parametrize("t", [1, 2, 4])
@pytest.mark.parametrize("state_dtype,act", [(torch.float32, torch.float32), (torch.float32, BF), (BF, BF)])
def test_sigmoid_gating_update_same_as_vllm(n, t, state_dtype, act):
    x = _inputs(n, t, state_dtype, act, seed=10 * n + t)
    spec = t > 1
    idx = x["idx"] if spec else x["idx"][:, 0].contiguous()
    if spec and n > 0:
        x["num_acc"][0] = max(1, t - 1)  # accepted below T
    kw = dict(A_log=x["A_log"], a=x["a"], b=x["b"], dt_bias=x["dt_bias"], q=x["q"], k=x["k"], v=x["v"],
              inplace_final_state=True, cu_seqlens=x["cu"], ssm_state_indices=idx,
              num_accepted_tokens=x["num_acc"] if spec else None, use_qk_l2norm_in_kernel=True)
    s_v, s_s = x["state"].clone(), x["state"].clone()
    o_v, f_v = VLLM.sigmoid_gating_update(initial_state=s_v, **kw)
    r = vllm_entry.try_sigmoid_gating_update(initial_state=s_s, **kw)
    assert r is not None
    o_s, f_s = r
    assert f_v is s_v and f_s is s_s and o_s.shape == o_v.shape and o_s.dtype == o_v.dtype
    first = idx if idx.dim() == 1 else idx.gather(1, (x["num_acc"].long() - 1)[:, None])[:, 0]
    valid = torch.repeat_interleave(first > 0, t)
    assert valid.any()
    assert rel(o_s[0, valid], o_v[0, valid]) <= tol(state_dtype, act)
    assert rel(s_s, s_v) <= tol(state_dtype)
    written = {int(s) for s in idx.reshape(-1).tolist() if s > 0}
    untouched = [s for s in range(s_v.shape[0]) if s not in written]
    assert torch.equal(s_s[untouched], s_v[untouched])
