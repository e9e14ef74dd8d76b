"""Replayed GDN spec verify (sndr/kernels/gdn/replay.py) on the CPU, through Triton's interpreter.

The property (Hypothesis, multi-step): over random serving schedules (requests admitted
with a prefilled state, verify steps of 1..cols tokens per request in random batches and
row orders, num_accepted random in [1, previous step's tokens] with full acceptance
favoured, rejections, requests finishing and their slots reused by new requests in another
column order, "mixed" steps that leave replay through ``materialize`` and run the snapshot
kernel), after every step:

* the replayed step's normed outputs equal, bit for bit, those of PK0003's snapshot kernel
  (the same float32 arithmetic: the Triton interpreter runs each operation as written);
* both are within the stated tolerance of vLLM's snapshot semantics run naively in float64
  arithmetic (``reference.post_conv_mtp``; a bf16 pool is rounded where vLLM rounds);

and at the end every live request's snapshots (the columns of its last step), materialised
from the replay side buffer, equal the snapshot kernel's bit for bit and the float64 run's
within tolerance. Tiny shapes (H = 1, HV = 2, K = 8, V = 16; 3 columns) keep the
interpreter fast; the GPU test runs the 35B-A3B head shape.

Also: one state write per request and step (no other slot changes), padding rows, a first
step with num_accepted outside [1, columns] (no state, as vLLM's CUDA op), and the
fallback reason codes.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="torch not installed (install the [kernels] extra)")
if torch.cuda.is_available():
    pytest.skip("CPU-interpreter tests (a GPU is present: test_gdn_replay_gpu.py)", allow_module_level=True)
if sys.modules.get("triton") is not None and os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
    pytest.skip("triton was imported before TRITON_INTERPRET=1 could be set; run this file alone",
                allow_module_level=True)
os.environ.setdefault("TRITON_INTERPRET", "1")
try:
    import triton  # noqa: F401
except ImportError as exc:
    pytest.skip(f"triton unavailable: {exc} (install the [kernels] extra)", allow_module_level=True)
hyp = pytest.importorskip("hypothesis", reason="hypothesis not installed (test extra)")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
import _gdn_replay_sim as sim_mod  # noqa: E402

from sndr.errors import CODES  # noqa: E402
from sndr.kernels.gdn import kernels, reference, replay, vllm_entry  # noqa: E402
from sndr.kernels.turboquant_k8v4 import _interp  # noqa: E402

if kernels.interpreting():
    _interp.fix_scalar_index()

H, HV, K, V, COLS = 1, 2, 8, 16, 3
BF = torch.bfloat16
#: float64 tolerance, relative L2 per step: the bf16 outputs are rounded twice (before and
#: after the norm); a bf16 pool adds one rounding per step's carried state.
OUT_TOL = {torch.float32: 1.5e-2, torch.bfloat16: 2.5e-2}
STATE_TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2}


def _rel(x, ref) -> float:
    x, ref = x.double(), ref.double()
    return ((x - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def _checker(dtype):
    def check(sim):
        o_ref, o_snap, o_rep = sim.last
        assert torch.equal(o_rep, o_snap), f"replay != snapshot kernel after {sim.log[-1]}"
        assert _rel(o_rep, o_ref) <= OUT_TOL[dtype], (sim.log[-1], _rel(o_rep, o_ref))
    return check


def _final(sim, dtype):
    got = sim.final_snapshots()
    if got is None:
        return
    ref, snap, rep = got
    assert torch.equal(rep, snap), "materialised snapshots != the snapshot kernel's"
    assert _rel(rep, ref) <= STATE_TOL[dtype], _rel(rep, ref)


OPS = st.lists(
    st.one_of(
        st.tuples(st.just("admit"), st.just(0)),
        st.tuples(st.just("finish"), st.integers(0, 7)),
        st.tuples(st.sampled_from(["step", "step", "step", "mixed"]), st.integers(1, 15)),
    ),
    min_size=3, max_size=9,
)


def _property(ops, dtype, seed):
    # two requests up front, so that every schedule verifies something
    sim = sim_mod.Sim(H=H, HV=HV, K=K, V=V, cols=COLS, n_slots=1 + 4 * COLS, state_dtype=dtype, device="cpu",
                      seed=seed)
    sim.admit()
    sim.admit()
    sim_mod.run_schedule(sim, [("step", 3)] + list(ops), _checker(dtype))
    _final(sim, dtype)


# The interpreter runs a step in about a second: a few schedules in the fast tier, 40 with --slow. The fast tier's
# schedules are fixed (derandomize): a random one with a bf16 pool once ended 2.9e-2 from float64 after about 30
# steps on one request (OUT_TOL 2.5e-2; the replay still equal to the snapshot kernel bit for bit), so a random
# draw made CI fail by chance. --slow keeps drawing new schedules.
@settings(max_examples=5, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(ops=OPS, dtype=st.sampled_from([torch.float32, BF]), seed=st.integers(0, 2**16))
def test_replay_equals_snapshots_over_random_schedules(ops, dtype, seed):
    _property(ops, dtype, seed)


@pytest.mark.slow
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=OPS, dtype=st.sampled_from([torch.float32, BF]), seed=st.integers(0, 2**16))
def test_replay_equals_snapshots_over_many_random_schedules(ops, dtype, seed):
    _property(ops, dtype, seed)


@pytest.mark.parametrize("dtype", [torch.float32, pytest.param(BF, marks=pytest.mark.slow)])
def test_long_schedule_with_slot_reuse(dtype):
    """Twelve steps: every request finishes once and its slots go to a new one; two mixed steps."""
    sim = sim_mod.Sim(H=H, HV=HV, K=K, V=V, cols=COLS, n_slots=1 + 3 * COLS, state_dtype=dtype, device="cpu",
                      seed=7)
    ops = [("admit", 0), ("admit", 0), ("admit", 0), ("step", 7), ("step", 7), ("step", 5), ("finish", 0),
           ("admit", 0), ("step", 7), ("mixed", 7), ("step", 7), ("finish", 1), ("admit", 0), ("step", 7),
           ("step", 3), ("finish", 0), ("finish", 0), ("admit", 0), ("admit", 0), ("step", 7), ("mixed", 6),
           ("step", 7), ("step", 7)]
    seen = []
    check = _checker(dtype)

    def both(s):
        check(s)
        seen.append(s.log[-1])

    sim_mod.run_schedule(sim, ops, both)
    assert len(seen) == 12
    assert sum(1 for e in sim.log if e[0] == "finish") == 4
    # a replayed step reads side entries: some step accepted more than one token of an entry
    assert any(max(e[2]) > 1 for e in seen if e[0] == "step" and not e[4])
    _final(sim, dtype)


def _one_step_setup(dtype, seed=3, n=3, t=3):
    g = torch.Generator().manual_seed(seed)
    slots = 1 + n * t
    state = (torch.randn(slots, HV, V, K, generator=g) * 0.1).to(dtype)
    idx = (torch.randperm(slots - 1, generator=g) + 1).reshape(n, t).to(torch.int32)
    width = 2 * H * K + HV * V
    qkvz = torch.randn(n * t, width + HV * V, generator=g).to(BF)
    ba = torch.randn(n * t, 2 * HV, generator=g).to(BF)
    b, a = ba.chunk(2, dim=-1)
    return dict(state=state, idx=idx, mixed=qkvz[:, :width], gate=qkvz[:, width:].view(n * t, HV, V), a=a, b=b,
                A_log=torch.rand(HV, generator=g) * 2 - 1, dt_bias=torch.rand(HV, generator=g) * 2 - 1,
                w=(torch.rand(V, generator=g) + 0.5).to(BF), cu=torch.arange(0, n * t + 1, t, dtype=torch.int32))


def _call(rep, c, acc, out, idx=None, cu=None):
    rep.step(c["mixed"], c["a"], c["b"], c["A_log"], c["dt_bias"], c["idx"] if idx is None else idx,
             c["cu"] if cu is None else cu, acc, c["state"], c["gate"], c["w"], out, K**-0.5, 1e-6, "silu")


@pytest.mark.parametrize("dtype", [torch.float32, BF])
def test_one_state_write_per_request_and_step(dtype):
    c = _one_step_setup(dtype)
    rep = replay.GdnReplay(c["state"], H, max_tokens=COLS, max_requests=8)
    out = torch.empty(9, HV, V, dtype=BF)
    acc = torch.tensor([1, 2, 3], dtype=torch.int32)
    for step in range(3):
        before = c["state"].clone()
        _call(rep, c, acc, out)
        changed = {int(s) for s in (c["state"] != before).flatten(1).any(1).nonzero().flatten()}
        assert changed <= {int(s) for s in c["idx"][:, 0]}, (step, changed)
        if step:
            assert changed == {int(s) for s in c["idx"][:, 0]}  # replayed bases differ from the last
        for s in c["idx"][:, 0]:
            assert rep.pending(int(s)) == COLS
    assert rep.side_bytes_per_token() == H * K * 4 + HV * V * 2 + HV * 8


def test_padding_rows_and_first_step_outside_accepted_range():
    c = _one_step_setup(torch.float32)
    idx = c["idx"].clone()
    idx[1, 0] = -1  # a padding row (vLLM pads with -1 or NULL_BLOCK_ID 0)
    acc = torch.tensor([4, 1, 0], dtype=torch.int32)  # rows 0 and 2: no state (the CUDA op's rule)
    st0 = c["state"].clone()
    rep = replay.GdnReplay(c["state"], H, max_tokens=COLS, max_requests=8)
    out = torch.full((9, HV, V), float("nan"), dtype=BF)
    _call(rep, c, acc, out, idx=idx)
    assert torch.equal(out[3:6], torch.zeros_like(out[3:6]))
    assert torch.equal(c["state"][idx[1, 1:].long()], st0[idx[1, 1:].long()])
    # rows 0 and 2 start from a zero state, as vLLM's op and PK0003's strict rule do
    snap = st0.clone()
    out_s = torch.full_like(out, float("nan"))
    r = vllm_entry.try_post_conv_mtp(c["mixed"], c["a"], c["b"], c["A_log"], c["dt_bias"], idx, c["cu"], acc, snap,
                                     c["gate"], c["w"], out_s, K**-0.5, 1e-6, "silu")
    assert r is not None
    assert torch.equal(out[[0, 1, 2, 6, 7, 8]], out_s[[0, 1, 2, 6, 7, 8]])
    o64 = reference.post_conv_mtp(c["mixed"], c["a"], c["b"], c["A_log"], c["dt_bias"], idx, c["cu"], acc,
                                  st0.clone(), c["gate"], c["w"], K**-0.5, 1e-6, dtype=torch.float64)
    keep = [0, 1, 2, 6, 7, 8]
    assert _rel(out[keep], o64[keep]) <= OUT_TOL[torch.float32]


def test_invalidate_drops_a_stale_entry():
    """A slot whose owner changed (a new request's prefill) must not replay the old owner's tokens."""
    c = _one_step_setup(torch.float32)
    rep = replay.GdnReplay(c["state"], H, max_tokens=COLS, max_requests=8)
    out = torch.empty(9, HV, V, dtype=BF)
    acc = torch.ones(3, dtype=torch.int32)
    _call(rep, c, acc, out)
    s0 = int(c["idx"][0, 0])
    assert rep.pending(s0) == COLS
    fresh = torch.randn(HV, V, K) * 0.1
    c["state"][s0] = fresh  # the new owner's prefill
    rep.invalidate(torch.tensor([s0, 0, -1]))
    assert rep.pending(s0) == 0
    # its first step reads column acc - 1 = 0: the fresh state, exactly as the snapshot kernel
    snap = c["state"].clone()
    out_s = torch.empty_like(out)
    vllm_entry.try_post_conv_mtp(c["mixed"], c["a"], c["b"], c["A_log"], c["dt_bias"], c["idx"], c["cu"], acc, snap,
                                 c["gate"], c["w"], out_s, K**-0.5, 1e-6, "silu")
    _call(rep, c, acc, out)
    assert torch.equal(out[:3], out_s[:3])


def test_fallback_codes_are_registered_and_returned():
    for code in replay.FALLBACKS:
        assert code in CODES, code
    state = torch.zeros(4, HV, V, K)
    mixed = torch.zeros(2, 2 * H * K + HV * V, dtype=BF)
    idx = torch.ones(2, COLS, dtype=torch.int32)
    assert replay.why_not(state, mixed, idx) is None
    assert replay.why_not(state, mixed, idx, mamba_cache_mode="align") == "gdn_replay_prefix_caching"
    assert replay.why_not(state, mixed, idx, kv_transfer=True) == "gdn_replay_kv_transfer"
    assert replay.why_not(state, mixed, idx, num_prefills=1) == "gdn_replay_mixed_batch"
    assert replay.why_not(state, mixed, idx, num_decodes=2) == "gdn_replay_mixed_batch"
    assert replay.why_not(state.half(), mixed, idx) == "gdn_replay_unsupported"
    assert replay.why_not(state, mixed, torch.ones(2, 9, dtype=torch.int32)) == "gdn_replay_unsupported"
    assert replay.why_not(torch.zeros(4, 3, V, K), mixed, idx) == "gdn_replay_unsupported"  # HV % H


def test_step_refuses_calls_outside_its_contract():
    c = _one_step_setup(torch.float32)
    rep = replay.GdnReplay(c["state"], H, max_tokens=COLS, max_requests=8)
    out = torch.empty(9, HV, V, dtype=BF)
    acc = torch.ones(3, dtype=torch.int32)
    before = c["state"].clone()
    with pytest.raises(ValueError, match="activations are torch.float32"):
        rep.step(c["mixed"].float(), c["a"], c["b"], c["A_log"], c["dt_bias"], c["idx"], c["cu"], acc, c["state"],
                 c["gate"], c["w"], out, K**-0.5, 1e-6)
    with pytest.raises(ValueError, match="another state pool"):
        rep.step(c["mixed"], c["a"], c["b"], c["A_log"], c["dt_bias"], c["idx"], c["cu"], acc, c["state"].clone(),
                 c["gate"], c["w"], out, K**-0.5, 1e-6)
    with pytest.raises(ValueError, match="more requests than max_requests"):
        small = replay.GdnReplay(c["state"], H, max_tokens=COLS, max_requests=2)
        small.step(c["mixed"], c["a"], c["b"], c["A_log"], c["dt_bias"], c["idx"], c["cu"], acc, c["state"],
                   c["gate"], c["w"], out, K**-0.5, 1e-6)
    with pytest.raises(ValueError, match="out must be"):
        rep.step(c["mixed"], c["a"], c["b"], c["A_log"], c["dt_bias"], c["idx"], c["cu"], acc, c["state"],
                 c["gate"], c["w"], out[:, :1], K**-0.5, 1e-6)
    assert torch.equal(c["state"], before)  # nothing ran


# ----------------------------------------------------------------------------- the CUDA kernel (NVRTC)


def test_the_cpu_path_is_triton_and_cuda_is_refused_here():
    """On the CPU (and under the interpreter) GdnReplay runs the Triton kernels, which the proofs
    above exercise; asking for the CUDA kernel here is an error naming why."""
    pool = torch.zeros(4, HV, V, K)
    assert replay.GdnReplay(pool, H, max_tokens=COLS, max_requests=4).backend == "triton"
    assert "not a CUDA device" in replay.cuda_unsupported(pool, H, 4, torch.bfloat16, 1)
    assert replay.GdnReplay(pool, H, max_tokens=COLS).threads == (V // 2) * max(1, K // 16)  # fp32: 2 rows
    assert replay.GdnReplay(pool.to(BF), H, max_tokens=COLS).threads == (V // 4) * max(1, K // 16)
    with pytest.raises(ValueError, match="backend 'cuda': not a CUDA device"):
        replay.GdnReplay(pool, H, max_tokens=COLS, backend="cuda")
    with pytest.raises(ValueError, match="backend must be"):
        replay.GdnReplay(pool, H, max_tokens=COLS, backend="cutlass")


def test_cuda_defines_are_one_kernel_with_the_layers_launch_and_the_calls_kinds():
    """``GdnReplay.cuda_defines`` (what ``_cuda_kernel`` compiles, and ``benchmarks/gdn_sass_digest.py``
    digests): KSEL selects the one kernel of the build, the layout comes from the pool (the 35B-A3B shape:
    the defaults STEP_CFGS names per pool dtype), TM from max_tokens, X_KIND from the activation dtype,
    and the call's kinds replace the float32 defaults."""
    pool = torch.zeros(2, 32, 128, 128)
    for dt, (p, r, minb, pf) in ((torch.float32, (8, 2, 2, 1)), (BF, (8, 4, 2, 0))):
        rep = replay.GdnReplay(pool.to(dt), 16, max_tokens=3, max_requests=2, act_dtype=torch.float16)
        kinds = {"AB_KIND": 2, "Z_KIND": 1, "SIGMOID_GATE": 1}
        for name, ksel in (("gdn_replay_step", 0), (replay.PERSISTENT_KERNELS["l2"], 1),
                           (replay.PERSISTENT_KERNELS["copy"], 2), ("gdn_replay_materialize", 3)):
            defs = rep.cuda_defines(name, kinds)
            assert defs == {"H": 16, "HV": 32, "K": 128, "V": 128, "P": p, "R": r, "TM": 4, "MINB": minb,
                            "PREFETCH": pf, "STEP_SMEM_MAX": replay.step_smem_bytes(128, 128, 4),
                            "S_KIND": 0 if dt == torch.float32 else 2, "X_KIND": 1, "AB_KIND": 2, "ALOG_KIND": 0,
                            "DT_KIND": 0, "Z_KIND": 1, "W_KIND": 0, "O_KIND": 0, "SIGMOID_GATE": 1, "KSEL": ksel,
                            "SCATTER_SUMS": 1}
    with pytest.raises(KeyError):
        rep.cuda_defines("gdn_replay_prep", {})  # the removed split step has no build
    rep = replay.GdnReplay(pool, 16, max_tokens=3, max_requests=2, scatter_sums=False)
    assert "SCATTER_SUMS" not in rep.cuda_defines("gdn_replay_step", {})


@pytest.mark.parametrize("state_kind,p,r,minb", [(0, 8, 4, 2), (2, 8, 4, 2), (0, 8, 2, 2), (2, 4, 2, 2),
                                                 (0, 2, 1, 3), (2, 2, 1, 3)])
def test_cuda_kernel_compiles_for_sm90_at_the_35b_shape(state_kind, p, r, minb):
    """NVRTC compiles replay.cu (step and materialize) for sm_90 with the 35B-A3B head shape, both
    pool dtypes and the lane/row layouts the benchmark sweeps (no GPU needed; the GPU test runs it)."""
    from sndr.kernels import _cudart

    try:
        _cudart.nvrtc_version()
    except _cudart.CudaUnavailable as exc:
        pytest.skip(f"no NVRTC on this machine: {exc}")
    defs = {"H": 16, "HV": 32, "K": 128, "V": 128, "P": p, "R": r, "TM": 8, "MINB": minb, "S_KIND": state_kind,
            "X_KIND": 2, "AB_KIND": 2, "ALOG_KIND": 0, "DT_KIND": 0, "Z_KIND": 2, "W_KIND": 2, "O_KIND": 2,
            "SIGMOID_GATE": 0}
    cubin = _cudart.compile_cubin(replay.cuda_source(), "gdn_replay", "90", defs, cache=False)
    for name in (b"gdn_replay_step", b"gdn_replay_step_persistent", b"gdn_replay_step_copy", b"gdn_replay_materialize"):
        assert name in cubin
    assert b"gdn_replay_prep" not in cubin and b"gdn_replay_main" not in cubin  # the split step is gone


# the step kernels the benchmark times (the defaults per pool dtype, and 2 / 4 rows per thread with
# the other): (state kind, P, R, MINB, PREFETCH)
STEP_CFGS = [(0, 8, 2, 2, 1), (2, 8, 4, 2, 0), (0, 8, 4, 2, 1), (2, 8, 2, 2, 0)]


#: the builds compiled below: STEP_CFGS with the row sums by a reduce-scatter (GdnReplay's default scatter_sums:
#: SCATTER_SUMS 1), and the two defaults with one butterfly per sum (scatter_sums=False)
STEP_BUILDS = [(*c, 1) for c in STEP_CFGS] + [(0, 8, 2, 2, 1, 0), (2, 8, 4, 2, 0, 0)]


@pytest.mark.parametrize("tm", [2, 4, 8])
@pytest.mark.parametrize("state_kind,p,r,minb,pf,scatter", STEP_BUILDS)
def test_cuda_step_kernels_compile_without_spills(state_kind, p, r, minb, pf, scatter, tm, tmp_path):
    """The one-kernel step and its two persistent variants (the L2 prefetch and the TMA copy into
    shared memory), each compiled alone (KSEL, as GdnReplay compiles them) for sm_90 at the 35B-A3B
    shape: no local memory and no stack (cuobjdump's resource usage, where triton ships it)."""
    import shutil
    import subprocess

    from sndr.kernels import _cudart

    try:
        _cudart.nvrtc_version()
    except _cudart.CudaUnavailable as exc:
        pytest.skip(f"no NVRTC on this machine: {exc}")
    try:
        import triton as _tr

        tool = str(Path(_tr.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump")
        tool = tool if Path(tool).is_file() else shutil.which("cuobjdump")
    except ImportError:
        tool = shutil.which("cuobjdump")
    for ksel, name in ((0, "gdn_replay_step"), (1, "gdn_replay_step_persistent"), (2, "gdn_replay_step_copy")):
        defs = {"H": 16, "HV": 32, "K": 128, "V": 128, "P": p, "R": r, "TM": tm, "MINB": minb, "S_KIND": state_kind,
                "X_KIND": 2, "AB_KIND": 2, "ALOG_KIND": 0, "DT_KIND": 0, "Z_KIND": 2, "W_KIND": 2, "O_KIND": 2,
                "SIGMOID_GATE": 0, "PREFETCH": pf, "STEP_SMEM_MAX": replay.step_smem_bytes(128, 128, tm),
                "KSEL": ksel, **({"SCATTER_SUMS": 1} if scatter else {})}
        cubin = _cudart.compile_cubin(replay.cuda_source(), "gdn_replay", "90", defs, cache=False)
        assert name.encode() in cubin
        if tool is None:
            continue
        f = tmp_path / f"{name}.cubin"
        f.write_bytes(cubin)
        lines = subprocess.run([tool, "--dump-resource-usage", str(f)], capture_output=True, text=True).stdout.splitlines()
        usage = [lines[i + 1] for i, ln in enumerate(lines[:-1]) if f"Function {name}:" in ln]
        assert len(usage) == 1, lines
        assert "LOCAL:0" in usage[0] and "STACK:0" in usage[0], (name, usage[0])
    assert replay.copy_smem_bytes(128, 128, tm, 4 if state_kind == 0 else 2) <= replay.MAX_SMEM_PER_BLOCK


def test_bench_config_syntax_has_no_split_field(monkeypatch):
    """benchmarks/bench_gdn_replay.py's ``PxRxM[xF[xG]]`` configs: the remaining fields parse to
    GdnReplay's arguments ('-' or a missing field: its default); a config written for the removed
    split step (a sixth field, or the old numeric G in fifth place) is refused, never reread."""
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import bench_gdn_replay as bench

    assert bench.parse_cfgs("8x2x2x1,-x4x-x0xcopy,8x4x2x0x0,-x-x-x-xl2,8") == [
        (8, 2, 2, 1, None), (None, 4, None, 0, "copy"), (8, 4, 2, 0, None), (None, None, None, None, "l2"),
        (8, None, None, None, None)]
    assert bench.parse_cfgs("") == []
    assert bench.parse_cfgs("8x2x2x1/b,-/b") == [(8, 2, 2, 1, None, False), (None, None, None, None, None, False)]
    for bad, why in (("8x4x2x1x1", "G is '1'"), ("-x-x-x-x-x2", "6 fields"), ("8x4x2x1x0x0", "6 fields"),
                     ("8xfourx2", "R is 'four'"), ("8x2x2/x", "not '/b'")):
        with pytest.raises(ValueError, match=why):
            bench.parse_cfgs(bad)
