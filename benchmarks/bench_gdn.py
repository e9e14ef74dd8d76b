"""GDN decode / spec-verify step on one GPU: sndr's fused step (update + gated RMSNorm) vs what vLLM 0.32.0 runs by default.

    python benchmarks/bench_gdn.py [--norm-sweep] [--cuda-sweep] [--max-t 8] [--out DIR] [--triton-baselines [--check] [--bf16-state] [--sweep]]
        [--states fp32,bf16] [--batches 1,8,32,64,256] [--ts 1,2,3,4,6,8] [--ncu-launches --diag-cells bf16/32/2 [--ncu-shapes ...]]

Qwen3.5/3.6 35B-A3B head shape: 16 key heads, 32 value heads, K = V = 128,
bf16 activations as the Qwen GDN layer hands them (``mixed_qkv``, the output
gate and ``a``/``b`` are views of its projections), fp32 and bf16 state pools
[slots, 32, 128, 128], states at random slots. Cells: batch {1, 8, 32, 64, 256}
x T {1, 2, 3, 4, 6, 8}, both state dtypes, CUDA-graph replay and eager.

The default table compares, per cell:

* ``vLLM default``: at T >= 2 vLLM's fused CUDA op
  ``torch.ops._C.fused_gdn_decode_post_conv_mtp`` (what a pure spec-verify batch runs
  under ``VLLM_GDN_DECODE_KERNEL=cuda``), loaded from the 0.32.0 wheel's
  ``vllm/_C_stable_libtorch.abi3.so`` placed in ``.gpu/`` (git-ignored); at T = 1
  vLLM's packed decode and then the layer's gated RMSNorm (``_rms_norm_gated_cuda``:
  ``layer_norm_fwd_kernel`` launched as 0.32.0 launches it), both from the wheel's
  files copied by ``python -m sndr.kernels.gdn._vllm_baseline --from WHEEL``; the
  CUDA op's T = 1 time is shown beside it;
* ``sndr fused``: ``vllm_entry.try_post_conv_mtp`` (T >= 2) or
  ``vllm_entry.try_packed_decode_norm`` (T = 1), one launch each, the faster of sndr's
  two steps: the Triton step and the CUDA step (``step.cu``; its launch shape the fastest
  of ``CUDA_CANDIDATES`` in the cell, graph-replayed), each called through the entry with
  ``routing.measuring(kernel)``. The run writes ``routing.WINS``, ``CUDA`` and
  ``CUDA_SHAPES`` (``routing_wins.txt``).

Bound: one read of every touched state plus T snapshot writes at the copy
bandwidth measured in the run. Each replayed path (sndr's and vLLM's) is timed twice
per cell, before and after the eager timings; the lower median counts. Every cell first checks sndr, vLLM's default path
and a float64 recurrence + RMSNormGated against each other (outputs and every
written snapshot). ``--norm-sweep`` times the fused step for a grid of (BV, warps)
launch shapes next to the CUDA op; ``--cuda-sweep`` the CUDA step's launch shapes
(``CUDA_SWEEP``), each first checked against float64. ``--triton-baselines`` adds the older table:
sndr's update alone vs vLLM's two Triton kernels and FLA (``--sweep``: its
launch-shape grid). Timing: ``triton.testing.do_bench`` medians, L2 flushed
before each call by do_bench's 256 MB write; ``--flush read`` times every path instead after a flush
that *reads* 256 MB (``_tq_gpu.clean_cold_us``: no dirty lines left for the timed call to write back, as
after a layer's projections, which read weights), the median of 100 event-timed calls.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

if "--cpu-smoke" in sys.argv:  # tiny shapes through Triton's interpreter, to test this script
    os.environ["TRITON_INTERPRET"] = "1"
DEV = "cpu" if "--cpu-smoke" in sys.argv else "cuda"

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from sndr.kernels.gdn import _vllm_baseline, cuda_step, kernels, reference, routing, vllm_entry  # noqa: E402

if kernels.interpreting():  # the interpreter's scalar masked loads, as the CPU tests set them up
    from sndr.kernels.turboquant_k8v4 import _interp

    _interp.fix_scalar_index()

H, HV, K, V = 16, 32, 128, 128
BATCHES = (1, 8, 32, 64, 256)
TS = (1, 2, 4)
OUT = Path(os.environ.get("OUT", ROOT / ".bench"))
SWEEP = [(8, 1), (8, 2), (8, 4), (16, 1), (16, 2), (16, 4), (32, 1), (32, 2), (32, 4), (32, 8), (64, 4), (64, 8)]


def log(*a):
    print(*a, flush=True)


def sync():
    if DEV == "cuda":
        torch.cuda.synchronize()


#: how the L2 is flushed before each timed call: "write" (do_bench's) or "read" (--flush read)
FLUSH = "write"


def bench(fn, graph: bool, rep: int = 100, warmup: int = 25) -> float:
    """Median microseconds per call (L2 flushed before each, as FLUSH says)."""
    if DEV == "cpu":
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e6
    fn()
    sync()
    if graph:
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            fn()
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fn()
        sync()
        run = g.replay
    else:
        run = fn
    if FLUSH == "read":
        from _tq_gpu import clean_cold_us  # (benchmarks/: the one home of the read flush)

        return clean_cold_us(run)
    return triton.testing.do_bench(run, warmup=warmup, rep=rep, return_mode="median") * 1e3


def device_line() -> str:
    if DEV == "cpu":
        return f"cpu (Triton interpreter), torch {torch.__version__}, triton {triton.__version__}"
    import _tq_gpu

    return _tq_gpu.device_line()


def copy_bandwidth() -> float:
    if DEV == "cpu":
        return 10.0
    import _tq_gpu

    return _tq_gpu.copy_bandwidth(rep=300)


def bound_us(state_bytes: int, t: int, bw: float) -> float:
    """The snapshot bound of a cell, µs: one read of every touched state plus T snapshot writes (T = 1: one
    read, one write back) at the copy bandwidth ``bw`` (GB/s, bytes read + written)."""
    return (1 + t) * state_bytes / (bw * 1e9) * 1e6


def _pool(n: int, t: int, state_dtype: torch.dtype, g: torch.Generator):
    """Both cells' state pool and indexing, drawn from ``g`` in this order: a pool of n T + 1 slots (slot 0
    unused), every request's T slots at random places ([n, T] int32, and its column 0), ``num_accepted`` random in
    [1, T], uniform ``cu_seqlens``."""
    slots = n * t + 1
    state = (torch.randn(slots, HV, V, K, generator=g, device=DEV) * 0.1).to(state_dtype)
    perm = torch.randperm(slots - 1, generator=g, device=DEV) + 1
    idx = perm.reshape(n, t).to(torch.int32).contiguous()
    num_acc = torch.randint(1, t + 1, (n,), generator=g, device=DEV, dtype=torch.int32)
    cu = torch.arange(0, n * t + 1, t, device=DEV, dtype=torch.int32)
    return state, idx, idx[:, 0].contiguous(), num_acc, cu


class Cell:
    """One batch x T problem: a state pool with every sequence's T slots at random places."""

    def __init__(self, n: int, t: int, state_dtype: torch.dtype, seed: int = 0):
        self.n, self.t = n, t
        h, hv, k, v = H, HV, K, V
        self.h, self.hv, self.k, self.v = h, hv, k, v
        g = torch.Generator(device=DEV).manual_seed(seed)
        dev = DEV
        tok = n * t
        self.state, self.idx2, self.idx1, self.num_acc, self.cu = _pool(n, t, state_dtype, g)
        bf = torch.bfloat16
        self.mixed = torch.randn(tok, 2 * h * k + hv * v, generator=g, device=dev).to(bf)
        self.q = torch.randn(1, tok, h, k, generator=g, device=dev).to(bf)
        self.kk = torch.randn(1, tok, h, k, generator=g, device=dev).to(bf)
        self.vv = torch.randn(1, tok, hv, v, generator=g, device=dev).to(bf)
        self.a = torch.randn(tok, hv, generator=g, device=dev).to(bf)
        self.b = torch.randn(tok, hv, generator=g, device=dev).to(bf)
        self.A_log = torch.rand(hv, generator=g, device=dev) * 2 - 1
        self.dt_bias = torch.rand(hv, generator=g, device=dev) * 2 - 1
        self.out = torch.empty(tok, 1, hv, v, device=dev, dtype=bf)
        self.scale = k**-0.5
        self.fla_h0 = None

    def state_bytes(self) -> int:
        return self.n * self.hv * self.v * self.k * self.state.element_size()

    # --- the kernels -------------------------------------------------------------------

    def sndr_packed(self, config=None):
        if config is None:
            r = vllm_entry.try_packed_decode(self.mixed, self.a, self.b, self.A_log, self.dt_bias, self.scale,
                                             self.state, self.out, self.idx1, True)
            assert r is not None
            return r
        return kernels.gdn_step(self.mixed, None, None, self.a, self.b, self.A_log, self.dt_bias, self.state,
                                self.idx1, self.out.view(self.n, self.hv, self.v), scale=self.scale,
                                n_seqs=self.n, l2norm=True, config=config)

    def _spec_args(self):
        return dict(A_log=self.A_log, a=self.a, b=self.b, dt_bias=self.dt_bias, q=self.q, k=self.kk, v=self.vv,
                    initial_state=self.state, inplace_final_state=True, cu_seqlens=self.cu,
                    ssm_state_indices=self.idx2 if self.t > 1 else self.idx1,
                    num_accepted_tokens=self.num_acc if self.t > 1 else None, use_qk_l2norm_in_kernel=True)

    def sndr_spec(self, config=None):
        if config is None:
            r = vllm_entry.try_sigmoid_gating_update(**self._spec_args())
            assert r is not None
            return r
        tok = self.n * self.t
        o = self._o if hasattr(self, "_o") else torch.empty(tok, self.hv, self.v, device=DEV, dtype=torch.bfloat16)
        self._o = o
        return kernels.gdn_step(
            self.q.view(tok, self.h, self.k), self.kk.view(tok, self.h, self.k), self.vv.view(tok, self.hv, self.v),
            self.a, self.b, self.A_log, self.dt_bias, self.state, self.idx2 if self.t > 1 else self.idx1, o,
            scale=self.scale, n_seqs=self.n, cu_seqlens=self.cu,
            num_accepted_tokens=self.num_acc if self.t > 1 else None, l2norm=True, idx_tok_stride=1, config=config)

    def sndr(self, config=None):
        return self.sndr_packed(config) if self.t == 1 else self.sndr_spec(config)

    def vllm_packed(self, vl):
        return vl.packed_decode(self.mixed, self.a, self.b, self.A_log, self.dt_bias, self.scale, self.state,
                                self.out, self.idx1, use_qk_l2norm_in_kernel=True)

    def vllm_sigmoid(self, vl):
        return vl.sigmoid_gating_update(**self._spec_args())

    def fla(self, fla_fn):
        if self.fla_h0 is None:
            # contiguous states of the N sequences (FLA has no slot index)
            self.fla_h0 = self.state[self.idx1.long()].float().contiguous()
            tok = self.n * self.t
            self.fla_q = self.q.view(self.n, self.t, self.h, self.k)
            self.fla_k = self.kk.view(self.n, self.t, self.h, self.k)
            self.fla_v = self.vv.view(self.n, self.t, self.hv, self.v)
            self.fla_a = self.a.view(self.n, self.t, self.hv)
            self.fla_b = self.b.view(self.n, self.t, self.hv)
            assert tok == self.n * self.t
        return fla_fn(q=self.fla_q, k=self.fla_k, v=self.fla_v, g=self.fla_a, beta=self.fla_b, scale=self.scale,
                      initial_state=self.fla_h0, output_final_state=True, use_qk_l2norm_in_kernel=True,
                      use_gate_in_kernel=True, A_log=self.A_log, dt_bias=self.dt_bias,
                      use_beta_sigmoid_in_kernel=True, state_v_first=True)


def load_vllm():
    d = _vllm_baseline.find_dir(ROOT)
    if d is None:
        log("vLLM 0.32.0 baseline: not found (copy it with python -m sndr.kernels.gdn._vllm_baseline --from ...); skipped")
        return None
    log(f"vLLM 0.32.0 baseline: {d}; sha256 {_vllm_baseline.source_sha256(d)}")
    return _vllm_baseline.load(d)


def load_fla():
    if DEV == "cpu":
        return None, "not on the CPU smoke run"
    try:
        import fla
        from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule
    except Exception as exc:  # noqa: BLE001
        log(f"FLA: not importable ({type(exc).__name__}: {exc}); skipped")
        return None, None
    ver = getattr(fla, "__version__", "?")
    log(f"FLA {ver}: fla.ops.gated_delta_rule.fused_recurrent_gated_delta_rule")
    return fused_recurrent_gated_delta_rule, ver


def check(cell: Cell, vl) -> str:
    """sndr vs vLLM on this cell's inputs (outputs and every written slot), from the same starting pool."""
    if vl is None:
        return "no vLLM baseline"
    s0 = cell.state.clone()
    if cell.t == 1:
        o_ref = cell.vllm_packed(vl)[0].clone()
    else:
        o_ref = cell.vllm_sigmoid(vl)[0].clone()
    st_ref = cell.state.clone()
    cell.state.copy_(s0)
    o = (cell.sndr_packed() if cell.t == 1 else cell.sndr_spec())[0]
    st = cell.state.clone()
    cell.state.copy_(s0)
    eo = ((o.float() - o_ref.float()).norm() / o_ref.float().norm()).item()
    es = ((st.float() - st_ref.float()).norm() / st_ref.float().norm()).item()
    return f"rel err vs vLLM: out {eo:.1e}, states {es:.1e}"


def timed(row, key, fn, graph, rep):
    try:
        row[key] = bench(fn, graph, rep)
    except Exception as exc:  # noqa: BLE001 - one failing baseline must not end the run
        row[key + "_error"] = f"{type(exc).__name__}: {exc}"[:300]
        log(f"{key}: {row[key + '_error']}")


def run_table(args, bw, vl, fla_fn, state_dtype, rows, rep):
    for n in args.batches:
        for t in args.ts:
            cell = Cell(n, t, state_dtype)
            sb = cell.state_bytes()
            bound_rw = bound_us(sb, 1, bw)
            bound_snap = bound_us(sb, t, bw)
            row = {"batch": n, "T": t, "state_dtype": str(state_dtype).split(".")[-1],
                   "bound_us": bound_rw if t == 1 else bound_snap, "bound_rw_us": bound_rw,
                   "config": str(kernels.pick_config(n, HV, V, K, torch.device(DEV)))}
            if args.check:
                try:
                    row["check"] = check(cell, vl)
                except Exception as exc:  # noqa: BLE001
                    row["check"] = f"check failed: {type(exc).__name__}: {exc}"[:300]
            if t == 1 and DEV == "cuda":
                # the practical floor: a device copy of the same bytes (read SB, write SB), graph-replayed
                src = torch.empty(sb, dtype=torch.uint8, device=DEV).random_()
                dst = torch.empty_like(src)
                timed(row, "copy_graph", lambda: dst.copy_(src), True, rep)
                del src, dst
            for mode in ("graph", "eager"):
                g = mode == "graph"
                timed(row, f"sndr_{mode}", lambda: cell.sndr(), g, rep)
                if vl is not None:
                    if t == 1:
                        timed(row, f"vllm_packed_{mode}", lambda: cell.vllm_packed(vl), g, rep)
                    timed(row, f"vllm_sigmoid_{mode}", lambda: cell.vllm_sigmoid(vl), g, rep)
                if fla_fn is not None and state_dtype == torch.float32:
                    timed(row, f"fla_{mode}", lambda: cell.fla(fla_fn), g, rep)
            kernels.FAST_LAUNCH = False  # sndr eager through Triton's own launch path, for comparison
            timed(row, "sndr_eager_jit_launch", lambda: cell.sndr(), False, rep)
            kernels.FAST_LAUNCH = True
            rows.append(row)
            log(json.dumps(row))
            if DEV == "cuda":
                torch.cuda.empty_cache()


def pct(bound, t):
    return f"{100 * bound / t:.0f}%" if t else "-"


def fmt_table(rows, bw) -> str:
    lines = []
    for mode in ("graph", "eager"):
        lines.append(f"\n### {mode} ({'CUDA-graph replay' if mode == 'graph' else 'eager Python call'}), "
                     f"time in µs (% of the bound)\n")
        lines.append("| state | batch | T | bound | copy of the same bytes | sndr | vLLM packed | vLLM sigmoid-gating |"
                     " FLA fused_recurrent | sndr vs best vLLM |")
        lines.append("|---|---|---|---|---|---|---|---|---|---|")
        for r in rows:
            b = r["bound_us"]
            s = r.get(f"sndr_{mode}")
            vp = r.get(f"vllm_packed_{mode}")
            vs = r.get(f"vllm_sigmoid_{mode}")
            fl = r.get(f"fla_{mode}")
            best_v = min(x for x in (vp, vs) if x is not None) if (vp or vs) else None
            cp = r.get("copy_graph")
            cells = [r["state_dtype"], str(r["batch"]), str(r["T"]), f"{b:.1f}",
                     f"{cp:.1f}" if cp and mode == "graph" else "-",
                     f"{s:.1f} ({pct(b, s)})",
                     f"{vp:.1f} ({pct(b, vp)})" if vp else "-",
                     f"{vs:.1f} ({pct(b, vs)})" if vs else "-",
                     f"{fl:.1f} ({pct(r['bound_rw_us'], fl)} of 1R+1W)" if fl else "-",
                     f"{best_v / s:.2f}x" if best_v else "-"]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def sweep(args, bw):
    log("\n## launch-shape sweep (graph replay, µs); heuristic choice marked *")
    res = []
    for n in args.sweep_batches:
        for t in (1, 4):
            cell = Cell(n, t, torch.float32)
            pick = kernels.pick_config(n, HV, V, K, torch.device(DEV))
            times = {}
            for bv, w in SWEEP:
                cfg = kernels.StepConfig(bv, w)
                times[(bv, w)] = bench(lambda: cell.sndr(cfg), True, rep=40, warmup=10)
            best = min(times, key=times.get)
            sb = cell.state_bytes()
            bound = bound_us(sb, t, bw)
            line = " ".join(f"{bv}x{w}{'*' if (bv, w) == (pick.block_v, pick.num_warps) else ''}:{us:.1f}"
                            for (bv, w), us in times.items())
            log(f"batch {n:4d} T {t}: bound {bound:.1f}; best {best} {times[best]:.1f}; {line}")
            res.append({"batch": n, "T": t, "times": {f"{bv}x{w}": us for (bv, w), us in times.items()},
                        "pick": f"{pick.block_v}x{pick.num_warps}", "best": f"{best[0]}x{best[1]}"})
            if DEV == "cuda":
                torch.cuda.empty_cache()
    return res


# ----------------------------------------------------------------------------- vLLM's default path


def load_cuda_op():
    """vLLM 0.32.0's ``torch.ops._C.fused_gdn_decode_post_conv_mtp`` (from the wheel's library), or None."""
    if DEV == "cpu":
        return None, "not on the CPU smoke run"
    if not hasattr(torch.ops._C, "fused_gdn_decode_post_conv_mtp"):
        lib = ROOT / ".gpu" / "_C_stable_libtorch.abi3.so"
        if not lib.is_file():
            return None, f"{lib} missing (vllm/_C_stable_libtorch.abi3.so from the 0.32.0 wheel)"
        try:
            torch.ops.load_library(str(lib))
        except Exception as exc:  # noqa: BLE001
            return None, f"load_library failed: {type(exc).__name__}: {exc}"[:300]
    try:
        return torch.ops._C.fused_gdn_decode_post_conv_mtp, "torch.ops._C.fused_gdn_decode_post_conv_mtp"
    except Exception as exc:  # noqa: BLE001
        return None, f"op not registered: {exc}"[:300]


class LayerCell:
    """One batch x T step as the Qwen GDN layer hands it over on vLLM's default path.

    ``mixed_qkv``, the output gate and ``a``/``b`` are views of the layer's projections
    ([q | k | v | z] and [b | a] per token), the pool holds every request's T snapshot
    slots at random places, ``num_accepted_tokens`` is random in [1, T], norm weight bf16,
    eps 1e-6, SiLU gate (Qwen3.5).
    """

    def __init__(self, n: int, t: int, state_dtype: torch.dtype, seed: int = 0):
        self.n, self.t = n, t
        g = torch.Generator(device=DEV).manual_seed(seed)
        tok = n * t
        bf = torch.bfloat16
        self.state, self.idx, self.idx1, self.num_acc, self.cu = _pool(n, t, state_dtype, g)
        width = 2 * H * K + HV * V
        self.qkvz = torch.randn(tok, width + HV * V, generator=g, device=DEV).to(bf)
        self.mixed = self.qkvz[:, :width]
        self.gate = self.qkvz[:, width:].view(tok, HV, V)
        self.ba = torch.randn(tok, 2 * HV, generator=g, device=DEV).to(bf)
        self.b, self.a = self.ba.chunk(2, dim=-1)
        self.A_log = torch.rand(HV, generator=g, device=DEV) * 2 - 1
        self.dt_bias = torch.rand(HV, generator=g, device=DEV) * 2 - 1
        self.w = (torch.rand(V, generator=g, device=DEV) + 0.5).to(bf)
        self.eps = 1e-6
        self.scale = K**-0.5
        self.out = torch.zeros(tok, HV, V, device=DEV, dtype=bf)
        self.out4 = self.out.view(tok, 1, HV, V)

    def state_bytes(self) -> int:
        return self.n * HV * V * K * self.state.element_size()

    def op(self, op):
        op(self.mixed, self.a, self.b, self.A_log, self.dt_bias, self.idx, self.cu, self.num_acc, self.state,
           self.gate, self.w, self.out, self.scale, self.eps, "silu")
        return self.out

    def sndr_mtp(self):
        r = vllm_entry.try_post_conv_mtp(self.mixed, self.a, self.b, self.A_log, self.dt_bias, self.idx, self.cu,
                                         self.num_acc, self.state, self.gate, self.w, self.out, self.scale,
                                         self.eps, "silu")
        assert r is not None
        return r

    def sndr_decode(self):
        r = vllm_entry.try_packed_decode_norm(self.mixed, self.a, self.b, self.A_log, self.dt_bias, self.scale,
                                              self.state, self.out, self.idx1, self.gate, self.w, self.eps, "silu")
        assert r is not None
        return r

    def sndr(self):
        return self.sndr_decode() if self.t == 1 else self.sndr_mtp()

    def via(self, kernel: str):
        """The entry of this cell (``sndr``) with every taken call routed to ``kernel`` ("triton" / "cuda")."""
        def run():
            with routing.measuring(kernel):
                return self.sndr()

        return run

    def cuda(self, cfg: cuda_step.CudaConfig, extra: dict | None = None):
        """The CUDA step at launch shape ``cfg``, launched directly (the sweep); ``extra``: more NVRTC defines
        (a variant of step.cu's, e.g. ``{"EARLY_QK": 0}``)."""
        steps = self.__dict__.setdefault("_cuda_steps", {})
        key = (cfg, tuple(sorted((extra or {}).items())))
        step = steps.get(key)
        spec = self.t > 1
        idx = self.idx if spec else self.idx1
        if step is None:
            plain = cuda_step.defines
            if extra:
                cuda_step.defines = lambda *a, **k: {**plain(*a, **k), **extra}  # type: ignore[assignment]
            try:
                step = steps[key] = cuda_step.CudaStep(
                    self.mixed, self.a, self.b, self.A_log, self.dt_bias, self.out, self.state, idx, self.gate,
                    self.w, n_req=self.n, spec=spec, scale=self.scale, norm_eps=self.eps, sigmoid_gate=False,
                    acc=self.num_acc if spec else None, cu=self.cu if spec else None, cfg=cfg)
            finally:
                cuda_step.defines = plain
        step(self.mixed, self.a, self.b, self.A_log, self.dt_bias, self.out, self.state, idx, self.gate, self.w,
             self.num_acc if spec else None, self.cu if spec else None)
        return self.out

    def vllm_decode(self, vl, norm):
        """vLLM's plain decode: the packed decode, then the layer's _rms_norm_gated_cuda."""
        vl.packed_decode(self.mixed, self.a, self.b, self.A_log, self.dt_bias, self.scale, self.state, self.out4,
                         self.idx1, use_qk_l2norm_in_kernel=True)
        norm(self.out, self.gate, self.out, self.w, self.eps, "silu")
        return self.out

    def traffic(self, block: int):
        """The cell's state traffic with no math (:func:`_traffic_kernel`): one read of every request's initial
        state (``idx[n, num_accepted - 1]``; T = 1: its slot) and T snapshot writes (T = 1: back in place)."""
        if not hasattr(self, "_src"):
            rows = torch.arange(self.n, device=DEV)
            self._src = (self.idx1 if self.t == 1 else self.idx[rows, self.num_acc.long() - 1]).contiguous()
            self._dst = (self.idx1 if self.t == 1 else self.idx).contiguous()
        _traffic_kernel[(self.n, HV, V * K // block)](self.state, self._src, self._dst, T=self.t, TILE=V * K,
                                                      BLOCK=block, num_warps=8)

    def ref64(self):
        st = self.state.double()
        acc = self.num_acc if self.t > 1 else torch.ones_like(self.num_acc)
        o = reference.post_conv_mtp_dense(self.mixed, self.a, self.b, self.A_log, self.dt_bias, self.idx, acc, st,
                                          self.gate, self.w, self.scale, self.eps, "silu")
        return o, st


@triton.jit
def _traffic_kernel(pool, src, dst, T: tl.constexpr, TILE: tl.constexpr, BLOCK: tl.constexpr):
    """The step's state traffic and nothing else: program (n, head, chunk) reads BLOCK elements of request n's
    initial state tile once and stores them to its T snapshot slots (``dst[n, :T]``)."""
    n = tl.program_id(0)
    h = tl.program_id(1)
    offs = tl.program_id(2) * BLOCK + tl.arange(0, BLOCK)
    heads = tl.num_programs(1)
    s = tl.load(src + n).to(tl.int64)
    x = tl.load(pool + (s * heads + h) * TILE + offs)
    for t in tl.static_range(T):
        d = tl.load(dst + n * T + t).to(tl.int64)
        tl.store(pool + (d * heads + h) * TILE + offs, x)


#: chunk sizes (elements) of the traffic kernel tried per cell; the fastest is the cell's "same bytes" time
TRAFFIC_BLOCKS = (2048, 4096, 8192)


def time_traffic(cell: LayerCell, rep: int) -> dict:
    """The cell's no-math traffic kernel graph-replayed at each of :data:`TRAFFIC_BLOCKS`: {block: µs} (or
    ``<block>_error``)."""
    out: dict = {}
    for blk in TRAFFIC_BLOCKS:
        timed(out, str(blk), lambda blk=blk: cell.traffic(blk), True, rep)
    return out


def _rel(x, ref) -> float:
    x, ref = x.double(), ref.double()
    return ((x - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def check_default(cell: LayerCell, op, vl, norm, cuda: bool = False) -> dict:
    """Outputs and written states of sndr, of vLLM's default path and of float64, from the same pool."""
    s0 = cell.state.clone()
    written = cell.idx.reshape(-1).long()
    res = {}
    o64, st64 = cell.ref64()
    runs = {"sndr": cell.via("triton")}
    if cuda:
        runs["cuda"] = cell.via("cuda")
    if op is not None:
        runs["op"] = lambda: cell.op(op)
    if cell.t == 1 and vl is not None and norm is not None:
        runs["vllm_decode"] = lambda: cell.vllm_decode(vl, norm)
    outs = {}
    for name, fn in runs.items():
        cell.state.copy_(s0)
        cell.out.fill_(float("nan"))
        o = fn().clone()
        outs[name] = (o, cell.state[written].clone())
        res[f"{name}_vs_f64_out"] = _rel(o, o64)
        res[f"{name}_vs_f64_state"] = _rel(outs[name][1], st64[written])
    base = "vllm_decode" if cell.t == 1 and "vllm_decode" in outs else "op"
    if base in outs:
        res["sndr_vs_default_out"] = _rel(outs["sndr"][0], outs[base][0])
        res["sndr_vs_default_state"] = _rel(outs["sndr"][1], outs[base][1])
        if "cuda" in outs:
            res["cuda_vs_default_out"] = _rel(outs["cuda"][0], outs[base][0])
            res["cuda_vs_default_state"] = _rel(outs["cuda"][1], outs[base][1])
        res["default"] = base
    cell.state.copy_(s0)
    return res


def run_default_table(args, bw, op, vl, norm, state_dtype, rows, rep):
    for n in args.batches:
        for t in args.default_ts:
            cell = LayerCell(n, t, state_dtype)
            sb = cell.state_bytes()
            row = {"batch": n, "T": t, "state_dtype": str(state_dtype).split(".")[-1],
                   "bound_us": bound_us(sb, t, bw),
                   "config": str(kernels.pick_config(n, HV, V, K, torch.device(DEV), state_dtype=state_dtype, fused_norm=True, tokens=t))}
            kernels_timed = {"triton": cell.via("triton")}
            if DEV == "cuda":
                # the CUDA step's launch shape of this cell: the fastest candidate, graph-replayed (what
                # routing.CUDA_SHAPES records and cuda_step.pick_config then launches); set before the cell's
                # entries first build their step
                cand = {}
                for label in args.cuda_candidates:
                    if t == 1 and cuda_step.CudaConfig.parse(label).spec_only():  # (spec-verify cells only)
                        continue
                    timed(cand, label, lambda label=label: cell.cuda(cuda_step.CudaConfig.parse(label)), True, rep)
                times = {k: v for k, v in cand.items() if not k.endswith("_error")}
                row["cuda_candidates"] = cand
                if times:
                    row["cuda_shape"] = min(times, key=times.__getitem__)
                    routing.CUDA_SHAPES.setdefault(row["state_dtype"], {}).setdefault(t, {})[n] = row["cuda_shape"]
                    kernels_timed["cuda"] = cell.via("cuda")
                row["cuda_config"] = cuda_step.pick_config(n, HV, V, K, state_dtype, t).label()
            try:
                row["check"] = check_default(cell, op, vl, norm, cuda="cuda" in kernels_timed)
            except Exception as exc:  # noqa: BLE001
                row["check_error"] = f"{type(exc).__name__}: {exc}"[:300]
            if DEV == "cuda":  # the same bytes with no math under this timing (a reference, not a ceiling)
                tr = time_traffic(cell, rep)
                if any(not k.endswith("_error") for k in tr):
                    row["traffic_graph"] = min(v for k, v in tr.items() if not k.endswith("_error"))
                row["traffic_blocks"] = tr
            for mode in ("graph", "eager"):
                gr = mode == "graph"
                for kname, fn in kernels_timed.items():
                    timed(row, f"sndr_{kname}_{mode}", fn, gr, rep)
                if op is not None:
                    timed(row, f"op_{mode}", lambda: cell.op(op), gr, rep)
                if t == 1:
                    timed(row, f"sndr_mtp_{mode}", cell.sndr_mtp, gr, rep)
                    if vl is not None and norm is not None:
                        timed(row, f"vllm_decode_{mode}", lambda: cell.vllm_decode(vl, norm), gr, rep)
            # Every replayed path is timed a second time, after the eager timings, and its lower median
            # counts (sndr's and vLLM's alike): in the first cells of a large pool, the first replay after
            # the float64 check ran up to 11% slower than the same captured launch replayed later or called
            # eagerly (fp32 batch 256, T >= 4); both medians stay in the row (``*_graph_first``, ``*_again``).
            dflt = "vllm_decode" if t == 1 else "op"
            again = {f"sndr_{kname}": fn for kname, fn in kernels_timed.items()}
            if op is not None:
                again["op"] = lambda: cell.op(op)
            if t == 1 and vl is not None and norm is not None:
                again["vllm_decode"] = lambda: cell.vllm_decode(vl, norm)
            for name, fn in again.items():
                timed(row, f"{name}_graph_again", fn, True, rep)
                first, second = row.get(f"{name}_graph"), row.get(f"{name}_graph_again")
                if first and second:
                    row[f"{name}_graph_first"] = first
                    row[f"{name}_graph"] = min(first, second)
            for mode in ("graph", "eager"):
                # the routed kernel of a cell: the faster of the two steps (routing.CUDA lists the CUDA cells)
                cands = {k: row[f"sndr_{k}_{mode}"] for k in kernels_timed if row.get(f"sndr_{k}_{mode}")}
                if cands:
                    best = min(cands, key=cands.__getitem__)
                    row[f"kernel_{mode}"] = best
                    row[f"sndr_{mode}"] = cands[best]
                s, d = row.get(f"sndr_{mode}"), row.get(f"{dflt}_{mode}")
                if s and d:
                    row[f"ratio_{mode}"] = s / d
            rows.append(row)
            log(json.dumps(row))
            if DEV == "cuda":
                torch.cuda.empty_cache()


def traffic_probe(args, bw, op):
    """Per cell: the snapshot bound, the no-math traffic kernel (each chunk size) and vLLM's op, graph-replayed."""
    for dname in args.states.split(","):
        dt = {"fp32": torch.float32, "bf16": torch.bfloat16}[dname]
        for n in args.batches:
            for t in args.default_ts:
                cell = LayerCell(n, t, dt)
                bound = bound_us(cell.state_bytes(), t, bw)
                row = time_traffic(cell, args.rep)
                if op is not None:
                    timed(row, "op", lambda: cell.op(op), True, args.rep)
                shares = " ".join(f"{k} {v:.1f} ({pct(bound, v)})" for k, v in row.items() if not k.endswith("_error"))
                log(f"{dname} batch {n:4d} T {t}: bound {bound:.1f}; {shares}")


def _verdict(r) -> str:
    """Hits and misses against issue 26's targets (graph replay)."""
    ratio = r.get("ratio_graph")
    if ratio is None:
        return "-"
    notes = []
    if r["T"] <= 4:
        notes.append("<=0.97x " + ("hit" if ratio <= 0.97 else "MISS"))
    if r["batch"] <= 8 and r["T"] >= 2:
        notes.append(">=1.15x faster " + ("hit" if 1 / ratio >= 1.15 else "MISS"))
    if r["batch"] >= 32 and r.get("sndr_graph"):
        need = 0.85 if r["state_dtype"] == "float32" else 0.75
        got = r["bound_us"] / r["sndr_graph"]
        notes.append(f">={need:.0%} of bound " + ("hit" if got >= need else "MISS"))
    return "; ".join(notes)


def fmt_targets(rows) -> str:
    """Issue 26's targets over the graph-replay cells: hits and misses, every cell named."""
    def name(r):
        return f"{r['state_dtype'][:4].replace('floa', 'fp32').replace('bflo', 'bf16')} b{r['batch']} T{r['T']}"

    g = [r for r in rows if r.get("ratio_graph")]
    t14 = [r for r in g if r["T"] <= 4]
    miss = [f"{name(r)} {r['ratio_graph']:.2f}" for r in t14 if r["ratio_graph"] > 0.97]
    small = [r for r in g if r["batch"] <= 8 and r["T"] >= 2]
    s_hit = [f"{name(r)} {1 / r['ratio_graph']:.2f}x" for r in small if 1 / r["ratio_graph"] >= 1.15]
    s_miss = [f"{name(r)} {1 / r['ratio_graph']:.2f}x" for r in small if 1 / r["ratio_graph"] < 1.15]
    big = [r for r in g if r["batch"] >= 32 and r.get("sndr_graph")]

    def frac(r):
        return r["bound_us"] / r["sndr_graph"]

    def need(r):
        return 0.85 if r["state_dtype"] == "float32" else 0.75

    def traffic(r):  # what the same bytes with no math reach under this timing
        tr = r.get("traffic_graph")
        return f" (no math: {r['bound_us'] / tr:.0%})" if tr else ""

    b_hit = [f"{name(r)} {frac(r):.0%}" for r in big if frac(r) >= need(r)]
    b_miss = [f"{name(r)} {frac(r):.0%}{traffic(r)}" for r in big if frac(r) < need(r)]
    b_out = [name(r) for r in big if r.get("traffic_graph") and r["bound_us"] / r["traffic_graph"] < need(r)]
    won = [r for r in g if round(r["ratio_graph"], 2) < 1.0]
    return "\n".join([
        f"- **<= 0.97x vLLM's default path, every T = 1..4 cell**: {len(t14) - len(miss)} of {len(t14)} hit. "
        f"Misses: {'; '.join(miss) or 'none'}.",
        f"- **>= 1.15x faster at batch <= 8 with T >= 2**: {len(s_hit)} of {len(small)} hit "
        f"({'; '.join(s_hit) or 'none'}). Misses: {'; '.join(s_miss) or 'none'} (speed-up over the op; below 1 "
        "is slower).",
        f"- **From batch 32 up, >= 85% of the snapshot bound (fp32 state) / >= 75% (bf16)**: {len(b_hit)} of "
        f"{len(big)} hit ({'; '.join(b_hit) or 'none'}). Misses: {'; '.join(b_miss) or 'none'}. Cells where the "
        f"same bytes moved with no math (column 'same bytes, no math') miss the share too: "
        f"{'; '.join(b_out) or 'none'}.",
        f"- Cells where sndr / default printed below 1.00 (the routed graph cells): {len(won)} of {len(g)}.",
    ])


def fmt_default(rows) -> str:
    lines = []
    for mode in ("graph", "eager"):
        for dt in ("float32", "bfloat16"):
            sel = [r for r in rows if r["state_dtype"] == dt]
            if not sel:
                continue
            lines.append(f"\n### {dt} state, {'CUDA-graph replay' if mode == 'graph' else 'eager Python call'}, "
                         "µs (% of the bound)\n")
            lines.append("| batch | T | bound | vLLM default | vLLM CUDA op | sndr fused | sndr / default |"
                         + (" targets | same bytes, no math |" if mode == "graph" else "") + " Triton step | CUDA step |")
            lines.append("|---|---|---|---|---|---|---|" + ("---|---|" if mode == "graph" else "") + "---|---|")
            for r in sel:
                b = r["bound_us"]
                d = r.get(f"{'vllm_decode' if r['T'] == 1 else 'op'}_{mode}")
                o = r.get(f"op_{mode}")
                s = r.get(f"sndr_{mode}")
                ratio = r.get(f"ratio_{mode}")
                dname = "packed decode + norm" if r["T"] == 1 else "CUDA op"
                cells = [str(r["batch"]), str(r["T"]), f"{b:.1f}",
                         f"{d:.1f} ({pct(b, d)}) {dname}" if d else "-",
                         f"{o:.1f} ({pct(b, o)})" if o else "-",
                         f"{s:.1f} ({pct(b, s)})" if s else "-",
                         f"**{ratio:.2f}**" if ratio else "-"]
                if mode == "graph":
                    cells.append(_verdict(r))
                    tr = r.get("traffic_graph")
                    cells.append(f"{tr:.1f} ({pct(b, tr)})" if tr else "-")
                for kname in ("triton", "cuda"):  # both steps; the routed one (the faster) in bold
                    x = r.get(f"sndr_{kname}_{mode}")
                    mark = "**" if x and r.get(f"kernel_{mode}") == kname else ""
                    shape = f" {r['cuda_shape']}" if kname == "cuda" and x and r.get("cuda_shape") else ""
                    cells.append(f"{mark}{x:.1f}{mark}{shape}" if x else "-")
                lines.append("| " + " | ".join(cells) + " |")
    lines.append("\n### correctness (relative L2; states: every written snapshot)\n")
    lines.append("| state | batch | T | sndr vs default out | sndr vs default states | sndr vs f64 out |"
                 " default vs f64 out | sndr vs f64 states | default vs f64 states | CUDA step vs default out |"
                 " CUDA step vs default states | CUDA step vs f64 out | CUDA step vs f64 states |")
    lines.append("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        c = r.get("check", {})
        dflt = c.get("default", "op")
        f = lambda k: f"{c[k]:.1e}" if k in c else "-"  # noqa: E731
        lines.append(f"| {r['state_dtype']} | {r['batch']} | {r['T']} | {f('sndr_vs_default_out')} | "
                     f"{f('sndr_vs_default_state')} | {f('sndr_vs_f64_out')} | {f(dflt + '_vs_f64_out')} | "
                     f"{f('sndr_vs_f64_state')} | {f(dflt + '_vs_f64_state')} | {f('cuda_vs_default_out')} | "
                     f"{f('cuda_vs_default_state')} | {f('cuda_vs_f64_out')} | {f('cuda_vs_f64_state')} |")
    return "\n".join(lines)


NORM_SWEEP = ["8x1", "16x1", "16x2", "32x1", "32x2", "32x4", "64x2", "64x4"]


def parse_shape(spec: str) -> kernels.StepConfig:
    """``BVxWARPS`` plus flags: ``n`` no next-token prefetch, ``s`` streaming state traffic, ``rN`` a register
    cap of N per thread (e.g. ``32x1s``, ``32x1r168``)."""
    import re

    m = re.fullmatch(r"(\d+)x(\d+)([ns]*)(?:r(\d+))?", spec)
    if not m:
        raise SystemExit(f"launch shape {spec!r}: BVxWARPS, then n (no prefetch), s (streaming), rN (register cap)")
    flags = m.group(3)
    return kernels.StepConfig(int(m.group(1)), int(m.group(2)), prefetch="n" not in flags, stream="s" in flags,
                              maxnreg=int(m.group(4) or 0))


def _fused_step(cell: LayerCell, cfg):
    """The fused step of this cell's call at launch shape ``cfg``: the packed decode + norm at T = 1, the MTP call
    at T >= 2 (what ``try_packed_decode_norm`` / ``try_post_conv_mtp`` launch)."""
    if cell.t == 1:
        return kernels.gdn_step(cell.mixed, None, None, cell.a, cell.b, cell.A_log, cell.dt_bias, cell.state,
                                cell.idx1, cell.out, scale=cell.scale, n_seqs=cell.n, config=cfg,
                                output_gate=cell.gate, norm_weight=cell.w, norm_eps=cell.eps)
    return kernels.gdn_step(cell.mixed, None, None, cell.a, cell.b, cell.A_log, cell.dt_bias, cell.state, cell.idx,
                            cell.out, scale=cell.scale, n_seqs=cell.n, cu_seqlens=cell.cu,
                            num_accepted_tokens=cell.num_acc, idx_tok_stride=1, config=cfg, output_gate=cell.gate,
                            norm_weight=cell.w, norm_eps=cell.eps, strict_accepted=True, tokens_per_seq=cell.t)


def _label(cfg: kernels.StepConfig) -> str:
    """BVxWARPS, then n (no prefetch) and s (streaming state traffic) where set."""
    return (f"{cfg.block_v}x{cfg.num_warps}{'' if cfg.prefetch else 'n'}{'s' if cfg.stream else ''}"
            f"{f'r{cfg.maxnreg}' if cfg.maxnreg else ''}")


def norm_sweep(args, bw, op):
    """(BV, warps) of the fused-norm step on a subset of cells (graph replay), next to the CUDA op.

    Each shape's outputs and written states are first compared with the shipped pick's (relative L2)."""
    log("\n## fused-norm launch-shape sweep (graph replay, µs); heuristic choice marked *")
    res = []
    for dt in args.sweep_dtypes:
        for n in args.sweep_batches:
            for t in args.sweep_ts:
                cell = LayerCell(n, t, dt)
                pick = kernels.pick_config(n, HV, V, K, torch.device(DEV), state_dtype=dt, fused_norm=True, tokens=t)
                s0 = cell.state.clone()
                written = (cell.idx1 if t == 1 else cell.idx.reshape(-1)).long()
                _fused_step(cell, pick)
                o_ref, st_ref = cell.out.clone(), cell.state[written].clone()
                times, errs = {}, {}
                for shape in args.sweep_shapes:
                    cfg = parse_shape(shape)
                    cell.state.copy_(s0)
                    _fused_step(cell, cfg)
                    errs[shape] = max(_rel(cell.out, o_ref), _rel(cell.state[written], st_ref))
                    times[shape] = bench(lambda cfg=cfg, cell=cell: _fused_step(cell, cfg), True, rep=40, warmup=10)
                cell.state.copy_(s0)
                o = bench(lambda cell=cell: cell.op(op), True, rep=40, warmup=10) if op is not None else None
                best = min(times, key=times.get)
                mine = _label(pick)
                line = " ".join(f"{_label(parse_shape(sh))}{'*' if _label(parse_shape(sh)) == mine else ''}:{us:.1f}"
                                for sh, us in times.items())
                bad = {sh: f"{e:.1e}" for sh, e in errs.items() if e > 1e-2}
                log(f"{str(dt)[6:]} batch {n:4d} T {t}: op {'-' if o is None else f'{o:.1f}'}; best {best} "
                    f"{times[best]:.1f}; {line}" + (f"; DIFFERS from the pick: {bad}" if bad else ""))
                res.append({"state_dtype": str(dt), "batch": n, "T": t, "op": o, "pick": mine,
                            "times": dict(times), "max_rel_vs_pick": dict(errs)})
                torch.cuda.empty_cache()
    return res


#: the CUDA step's launch shapes the table times in every cell (graph replay; the fastest is routed)
#: (128x16x4t512m2, tried in gcuda2's run B: fastest CUDA shape only at bf16 batch 256 T = 4, still slower than the
#: Triton step there, and its fp32 build has a 40-byte stack frame: not a default candidate; --cuda-candidates)
#: (the last three: the state tile in shared memory, cuda_step.SMEM_TILE_SHAPES; gpers' runs of 2026-12-02 timed them
#: beside persistent forms, since removed: docs/bench-gdn-h200.md)
#: (the last five: the short load chain, cuda_step.CHAIN_SHAPES, and the 2-CTA register-tile shape; gb8's run of
#: 2026-12-02 timed them at batch 1 and 8, where they are routed: docs/bench-gdn-h200.md)
#: (then four: the cluster shapes with the norm's sums by st.async, cuda_step.ASYNC_NORM_SHAPES, beside their twins;
#: the last three: a uniform batch's token rows sent to L2 while cu_seqlens is in flight, cuda_step.GUESS_SHAPES)
#: (after them: the twins of the routed shapes with the row sums by a reduce-scatter, cuda_step.SCATTER_SHAPES, and
#: one at five CTAs per SM, cuda_step.SPILL_AT_CAP_SHAPES)
CUDA_CANDIDATES = ["128x8x1t128m6", "64x8x1t128m8", "128x8x4t256m2", "16x8x1t128m8", "128x8x2t256m4b",
                   "128x16x2t512m2b", "128x16x4t512m2b", "128x8x4t256m2c", "64x8x4t128m4c", "64x8x4t128m4",
                   "32x8x4t64m8c", "16x8x1t128m8c", "128x8x2t256m4cb", "128x16x4t512m2cb", "128x16x2t512m2cb",
                   "64x8x4t128m4ca", "32x8x4t64m8ca", "16x8x1t128m8ca", "64x8x1t128m8a",
                   "128x8x2t256m4cbg", "64x8x4t128m4cag", "128x8x4t256m2cg", *cuda_step.SCATTER_SHAPES,
                   *cuda_step.SPILL_AT_CAP_SHAPES]
CUDA_SWEEP = ["128x8x1t128m6", "128x8x1t128m6s", "128x8x1t64m12", "128x8x1t256m3", "64x8x1t128m8",
              "32x8x1t128m8", "128x8x4t256m2", "16x8x1t128m8"]


def parse_cuda(spec: str) -> cuda_step.CudaConfig:
    """``BVxPxR`` (rows per CTA, lanes per row, rows per thread), then ``tN`` (threads per CTA), ``mN`` (CTAs per
    SM asked of ptxas) and ``s`` (streaming snapshot stores), e.g. ``128x8x1t128m6s``."""
    try:
        return cuda_step.CudaConfig.parse(spec)
    except ValueError as exc:
        raise SystemExit(str(exc)) from None


def _variant(shape: str) -> dict:
    """``SHAPE:NAME=V:...`` (the sweep): step.cu's macro NAME set to V in that build, e.g. ``128x8x4t256m2:EARLY_QK=0``."""
    return {kv.split("=")[0]: int(kv.split("=")[1]) for kv in shape.split(":")[1:]}


def cuda_sweep(args, bw, op):
    """Launch shapes of the CUDA step on a subset of cells (graph replay), beside the Triton step's pick and the
    CUDA op; each shape's outputs and written states first compared with float64 (relative L2)."""
    log("\n## CUDA-step launch-shape sweep (graph replay, µs)")
    res = []
    for dt in args.sweep_dtypes:
        for n in args.sweep_batches:
            for t in args.sweep_ts:
                cell = LayerCell(n, t, dt)
                s0 = cell.state.clone()
                written = (cell.idx1 if t == 1 else cell.idx.reshape(-1)).long()
                o64, st64 = cell.ref64()
                times, errs = {}, {}
                for shape in args.cuda_shapes:
                    cfg, extra = parse_cuda(shape.split(":")[0]), _variant(shape)
                    why = cuda_step.config_why(K, V, dt, cfg)
                    if why:
                        errs[shape] = why
                        continue
                    try:
                        cell.state.copy_(s0)
                        cell.out.fill_(float("nan"))
                        cell.cuda(cfg, extra)
                        errs[shape] = max(_rel(cell.out, o64), _rel(cell.state[written], st64[written]))
                        times[shape] = bench(lambda cfg=cfg, cell=cell, extra=extra: cell.cuda(cfg, extra), True,
                                             rep=args.rep, warmup=10)
                    except Exception as exc:  # noqa: BLE001 - one failing shape must not end the sweep
                        errs[shape] = f"{type(exc).__name__}: {exc}"[:200]
                cell.state.copy_(s0)
                tri = bench(cell.via("triton"), True, rep=args.rep, warmup=10)
                o = bench(lambda cell=cell: cell.op(op), True, rep=args.rep, warmup=10) if op is not None else None
                best = min(times, key=times.__getitem__) if times else None
                sb = cell.state_bytes()
                bound = bound_us(sb, t, bw)
                line = " ".join(f"{sh}:{us:.1f}" for sh, us in times.items())
                log(f"{str(dt)[6:]} batch {n:4d} T {t}: bound {bound:.1f} op {'-' if o is None else f'{o:.1f}'} "
                    f"triton {tri:.1f}; best {best} {times.get(best, float('nan')):.1f}; {line}; errs vs f64 "
                    + " ".join(f"{sh}:{e:.1e}" if isinstance(e, float) else f"{sh}:{e}" for sh, e in errs.items()))
                res.append({"state_dtype": str(dt), "batch": n, "T": t, "op": o, "triton": tri, "bound": bound,
                            "times": dict(times), "rel_vs_f64": dict(errs)})
                del cell
                torch.cuda.empty_cache()
    return res


def _bench_on(fn, stream: torch.cuda.Stream, rep: int = 40) -> float:
    """Graph replay of one call captured on ``stream`` (warmed up on it, so nothing is allocated in the capture)."""
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    sync()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=stream):
        fn()
    sync()
    return triton.testing.do_bench(g.replay, warmup=10, rep=rep, return_mode="median") * 1e3


def replay_diag(args, op):
    """Why a replayed step can be slower than the same launch eager (fp32 batch 256, T >= 3 in the last run):
    the fused step replayed with its capture-stream workspace made inside / before the capture, the step
    without the norm (no workspace), a second pool placement, and the CUDA op, each eager and replayed."""
    log("\n## replay vs eager diagnosis (µs, L2 flushed)")
    res = []
    for dt, n, t in args.diag_cells:
        cell = LayerCell(n, t, dt)
        pick = kernels.pick_config(n, HV, V, K, torch.device(DEV), state_dtype=dt, fused_norm=True, tokens=t)
        r: dict = {"state_dtype": str(dt), "batch": n, "T": t, "pick": _label(pick)}
        fused = lambda cell=cell: _fused_step(cell, pick)  # noqa: E731
        r["fused_eager"] = bench(fused, False, rep=40, warmup=10)
        r["fused_graph"] = bench(fused, True, rep=40, warmup=10)  # workspace made inside the capture (first time)
        r["fused_graph_again"] = bench(fused, True, rep=40, warmup=10)  # the same workspace, captured again
        r["fused_graph_own_stream"] = _bench_on(fused, torch.cuda.Stream())  # workspace made before the capture
        plain = lambda cell=cell: kernels.gdn_step(  # noqa: E731
            cell.mixed, None, None, cell.a, cell.b, cell.A_log, cell.dt_bias, cell.state, cell.idx, cell.out,
            scale=cell.scale, n_seqs=cell.n, cu_seqlens=cell.cu, num_accepted_tokens=cell.num_acc, idx_tok_stride=1,
            config=pick, strict_accepted=True, tokens_per_seq=cell.t)
        r["update_only_eager"] = bench(plain, False, rep=40, warmup=10)
        r["update_only_graph"] = bench(plain, True, rep=40, warmup=10)
        if op is not None:
            r["op_eager"] = bench(lambda cell=cell: cell.op(op), False, rep=40, warmup=10)
            r["op_graph"] = bench(lambda cell=cell: cell.op(op), True, rep=40, warmup=10)
        spacer = torch.empty(768 << 20, dtype=torch.uint8, device=DEV)  # a second placement of the pool
        cell.state = cell.state.clone()
        r["moved_fused_eager"] = bench(fused, False, rep=40, warmup=10)
        r["moved_fused_graph"] = bench(fused, True, rep=40, warmup=10)
        del spacer
        r["counters_left_nonzero"] = sum(int((c != 0).sum()) for _, c in kernels._WORKSPACES.values())
        r["workspaces"] = [(int(w.numel()), int(c.numel())) for w, c in kernels._WORKSPACES.values()]
        log(json.dumps(r))
        res.append(r)
        del cell
        torch.cuda.empty_cache()
    return res


def ncu_cells(args, op):
    """One launch each of sndr's Triton step (its pick), of the CUDA step (the cell's routed launch shape,
    ``cuda_step.pick_config``, then every ``--ncu-shapes`` shape) and of the CUDA op per cell, inside an NVTX
    range ``prof`` (for ``ncu --nvtx --nvtx-include prof/``); compiled and warmed up outside it."""
    for dt, n, t in args.diag_cells:
        cell = LayerCell(n, t, dt)
        pick = kernels.pick_config(n, HV, V, K, torch.device(DEV), state_dtype=dt, fused_norm=True, tokens=t)
        shapes = [cuda_step.pick_config(n, HV, V, K, dt, t)]
        shapes += [c for c in map(parse_cuda, args.ncu_shapes) if c not in shapes]
        shapes = [c for c in shapes if cuda_step.config_why(K, V, dt, c) is None]
        _fused_step(cell, pick)
        for c in shapes:
            cell.cuda(c)
        if op is not None:
            cell.op(op)
        sync()
        log(f"ncu cell {dt} batch {n} T {t}: Triton step {_label(pick)}, CUDA step "
            f"{', '.join(c.label() for c in shapes)}, then the op")
        torch.cuda.nvtx.range_push("prof")
        _fused_step(cell, pick)
        for c in shapes:
            cell.cuda(c)
        if op is not None:
            cell.op(op)
        sync()
        torch.cuda.nvtx.range_pop()
        del cell
        torch.cuda.empty_cache()


def _prebuild_one(job) -> bool:
    """(label, state dtype name, T): compile the CUDA step's cubin a table cell asks for into the cubin cache."""
    from sndr.kernels import _cudart

    label, dname, t = job
    cfg = cuda_step.CudaConfig.parse(label)
    dt = {"fp32": torch.float32, "bf16": torch.bfloat16}[dname]
    if cuda_step.config_why(K, V, dt, cfg):
        return False
    tm = min(cuda_step.MAX_TM, 1 << max(0, (t - 1).bit_length()))
    # LayerCell's call: bf16 activations, gate, norm weight and output; fp32 A_log and dt_bias; int32 indices
    kinds = {"X_KIND": 2, "AB_KIND": 2, "ALOG_KIND": 0, "DT_KIND": 0, "Z_KIND": 2, "W_KIND": 2, "O_KIND": 2,
             "S_KIND": 0 if dt == torch.float32 else 2}
    defs = cuda_step.defines(H, HV, K, V, cfg, spec=t > 1, tm=tm, kinds=kinds)
    _cudart.compile_cubin(cuda_step.source(), "gdn_step", "90", defs)
    return True


def prebuild(args, workers: int) -> None:
    """Compile every candidate shape's cubin of the table's cells (--states, --ts) with ``workers`` processes
    first, so the run does not compile them one at a time (the same cubins, the cubin cache's keys)."""
    import multiprocessing as mp

    jobs = sorted({(label, d, t) for label in args.cuda_candidates for d in args.states.split(",")
                   for t in args.default_ts if not (t == 1 and cuda_step.CudaConfig.parse(label).spec_only())})
    t0 = time.perf_counter()
    with mp.get_context("spawn").Pool(workers) as pool:
        built = sum(pool.map(_prebuild_one, jobs))
    log(f"prebuilt {built} of {len(jobs)} candidate cubins with {workers} processes in {time.perf_counter() - t0:.0f} s")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--sweep", action="store_true", help="sndr's (BV, warps) grid of the Triton-baseline kernel")
    ap.add_argument("--norm-sweep", action="store_true", help="warps of the fused-norm launch vs the CUDA op")
    ap.add_argument("--cuda-sweep", action="store_true", help="launch shapes of the CUDA step (step.cu) vs the op")
    ap.add_argument("--cuda-candidates", type=str, default=",".join(CUDA_CANDIDATES),
                    help="the CUDA step's launch shapes timed (graph replay) in every cell of the table; the fastest "
                         "is the cell's CUDA step")
    ap.add_argument("--cuda-shapes", type=str, default=None,
                    help="(--cuda-sweep) comma-separated BVxPxR[mN][s] shapes (default: CUDA_SWEEP)")
    ap.add_argument("--no-table", action="store_true")
    ap.add_argument("--triton-baselines", action="store_true",
                    help="also the older table: sndr's update alone vs vLLM's Triton kernels and FLA")
    ap.add_argument("--check", action="store_true", help="(--triton-baselines) compare sndr with vLLM first")
    ap.add_argument("--bf16-state", action="store_true", help="(--triton-baselines) also a bf16 state pool")
    ap.add_argument("--max-t", type=int, default=8, help="largest T of the default-path table (the op takes <= 8)")
    ap.add_argument("--batches", type=str, default=None, help="comma-separated batches (default 1,8,32,64,256)")
    ap.add_argument("--ts", dest="table_ts", type=str, default=None,
                    help="comma-separated T of the default-path table (default 1,2,3,4,6,8 up to --max-t)")
    ap.add_argument("--states", type=str, default="fp32,bf16",
                    help="state pool dtypes of the default-path table, comma-separated (fp32, bf16)")
    ap.add_argument("--sweep-shapes", type=str, default=None,
                    help="(--norm-sweep) comma-separated BVxWARPS[n][s] launch shapes (default: NORM_SWEEP)")
    ap.add_argument("--sweep-cells", type=str, default=None,
                    help="(--norm-sweep) DTYPES/BATCHES/TS, e.g. fp32,bf16/8,32/1,2,4 (default: both/1,8,32,256/1,2,4)")
    ap.add_argument("--rep", type=int, default=100, help="do_bench's rep (ms) per timing")
    ap.add_argument("--flush", choices=("write", "read"), default="write",
                    help="the L2 flush before each timed call: do_bench's 256 MB write (default), or a 256 MB read "
                         "(_tq_gpu.clean_cold_us, 100 calls; no dirty lines to write back)")
    ap.add_argument("--replay-diag", action="store_true", help="replayed vs eager step, with the suspects varied")
    ap.add_argument("--ncu-launches", action="store_true",
                    help="only one launch of sndr's step and of the op per --diag-cells cell, in an NVTX range 'prof'")
    ap.add_argument("--diag-cells", type=str, default="fp32/256/4,fp32/256/2",
                    help="(--replay-diag, --ncu-launches) DTYPE/BATCH/T cells, comma-separated")
    ap.add_argument("--ncu-shapes", type=str, default="",
                    help="(--ncu-launches) CUDA-step launch shapes launched after the cell's routed one, comma-separated")
    ap.add_argument("--traffic-probe", action="store_true",
                    help="only the bound, the no-math traffic kernel and vLLM's op per --batches/--ts/--states cell")
    ap.add_argument("--prebuild", type=int, default=0, metavar="N",
                    help="first compile every candidate's cubin of the table's cells with N processes")
    ap.add_argument("--cpu-smoke", action="store_true")
    args = ap.parse_args()
    args.sweep_shapes = args.sweep_shapes.split(",") if args.sweep_shapes else NORM_SWEEP
    args.cuda_shapes = args.cuda_shapes.split(",") if args.cuda_shapes else CUDA_SWEEP
    args.cuda_candidates = [c for c in args.cuda_candidates.split(",") if c]
    args.ncu_shapes = [c for c in args.ncu_shapes.split(",") if c]
    for sh in args.ncu_shapes:
        parse_cuda(sh)
    for sh in args.cuda_candidates:
        parse_cuda(sh)
    for sh in args.cuda_shapes:
        parse_cuda(sh.split(":")[0])
        _variant(sh)
    for sh in args.sweep_shapes:
        parse_shape(sh)
    dts, sb, sts = (args.sweep_cells or "fp32,bf16/1,8,32,256/1,2,4").split("/")
    args.sweep_dtypes = [{"fp32": torch.float32, "bf16": torch.bfloat16}[d] for d in dts.split(",")]
    sweep_batches = tuple(int(x) for x in sb.split(","))
    args.sweep_ts = tuple(int(x) for x in sts.split(","))
    args.diag_cells = [({"fp32": torch.float32, "bf16": torch.bfloat16}[c.split("/")[0]], int(c.split("/")[1]),
                         int(c.split("/")[2])) for c in args.diag_cells.split(",")]
    global H, HV, K, V
    if args.cpu_smoke:
        H, HV, K, V = 2, 4, 16, 16
        args.batches, args.ts, args.sweep_batches = (1, 2), (1, 2), (1,)
        args.default_ts = (1, 2)
        rep = 1
    else:
        args.batches = tuple(int(x) for x in args.batches.split(",")) if args.batches else BATCHES
        args.ts, args.sweep_batches = TS, sweep_batches
        args.default_ts = (tuple(int(x) for x in args.table_ts.split(",")) if args.table_ts
                           else tuple(t for t in (1, 2, 3, 4, 6, 8) if t <= args.max_t))
        rep = args.rep
    args.out.mkdir(parents=True, exist_ok=True)
    global FLUSH
    FLUSH = args.flush
    if args.prebuild and DEV == "cuda":
        prebuild(args, args.prebuild)
    dl = device_line()
    log(f"device: {dl}")
    bw = copy_bandwidth()
    log(f"copy bandwidth (read + write): {bw:.0f} GB/s")
    vl = load_vllm()
    norm = _vllm_baseline.load_norm(_vllm_baseline.find_dir(ROOT)) if vl is not None else None
    log(f"vLLM 0.32.0 gated RMSNorm (layer_norm_fwd_kernel): {'loaded' if norm else 'missing; T = 1 baseline skipped'}")
    op, op_note = load_cuda_op()
    log(f"vLLM CUDA op: {op_note if op is None else 'loaded: ' + op_note}")
    result = {"device": dl, "copy_GBps": bw, "cuda_op": op_note, "cmd": " ".join(sys.argv), "flush": FLUSH}
    # every cell measured: the routing table is what this run decides (routing.WINS, written below)
    cells = routing.measuring()
    cells.__enter__()
    if args.ncu_launches:
        ncu_cells(args, op)
        return 0
    if args.traffic_probe:
        traffic_probe(args, bw, op)
        return 0
    if args.replay_diag:
        result["replay_diag"] = replay_diag(args, op)
    if args.norm_sweep:
        result["norm_sweep"] = norm_sweep(args, bw, op)
    if args.cuda_sweep:
        result["cuda_sweep"] = cuda_sweep(args, bw, op)
    if args.sweep:
        result["sweep"] = sweep(args, bw)
    rows: list[dict] = []
    if not args.no_table:
        for dt in [{"fp32": torch.float32, "bf16": torch.bfloat16}[x] for x in args.states.split(",")]:
            run_default_table(args, bw, op, vl, norm, dt, rows, rep)
    result["rows"] = rows
    old_rows: list[dict] = []
    if args.triton_baselines and not args.no_table:
        fla_fn, fla_ver = load_fla()
        result["fla"] = fla_ver
        run_table(args, bw, vl, fla_fn, torch.float32, old_rows, rep)
        if args.bf16_state:
            run_table(args, bw, vl, None, torch.bfloat16, old_rows, rep)
        result["triton_rows"] = old_rows
    result["launch_stats"] = dict(kernels.STATS)
    log(f"sndr launches: {kernels.STATS}")
    (args.out / "bench_gdn.json").write_text(json.dumps(result, indent=1))
    text = (f"device: {dl}\ncopy bandwidth {bw:.0f} GB/s\ncommand: {' '.join(sys.argv)}\n"
            f"L2 flush before each timed call: {FLUSH}\n")
    if rows:
        text += "\n## Targets (graph replay)\n\n" + fmt_targets(rows) + "\n" + fmt_default(rows) + "\n"
        wins = routing.wins_literal(rows) + "\n" + routing.wins_literal(rows, "CUDA") + "\n" + routing.shapes_literal(rows)
        (args.out / "routing_wins.txt").write_text(wins + "\n")
        text += ("\n## The routing tables of this run (sndr.kernels.gdn.routing.WINS, CUDA, CUDA_SHAPES)\n\n```\n" + wins
                 + "\n```\n")
    if old_rows:
        text += fmt_table(old_rows, bw) + "\n"
    (args.out / "bench_gdn.md").write_text(text)
    log(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
