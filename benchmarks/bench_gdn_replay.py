"""Replayed GDN spec verify (experimental) vs vLLM 0.32.0's CUDA op, a whole verify step each.

    python benchmarks/bench_gdn_replay.py [--out DIR] [--batches 1,8,32,64,256] [--ts 2,3,4,5,6,7,8]
        [--states float32,bfloat16] [--backend cuda|triton] [--configs 8x2x2x1,-x4x-x-xcopy] [--cpu-smoke]

Per cell (35B-A3B head shape: 16 key heads, 32 value heads, K = V = 128; bf16 activations
as the Qwen GDN layer hands them, built by ``bench_gdn.LayerCell``; fp32 and bf16 state):

* ``op``: ``torch.ops._C.fused_gdn_decode_post_conv_mtp`` (update + T snapshot writes +
  gated RMSNorm), loaded from the wheel's library by ``bench_gdn.load_cuda_op``;
* ``replay``: ``replay.GdnReplay.step`` (its CUDA kernel ``replay.cu`` on the GPU, or ``--backend
  triton``; ``--configs``: CUDA kernel configs ``PxRxM[xF[xG]]``, one row each, see ``--help``) in
  steady state (every request has a side entry of
  T tokens from the previous step) with **every token accepted** (num_accepted = T: the most
  replay work), i.e. replay T tokens + base write + T new tokens + side writes + the fused norm.

Bounds, at the copy bandwidth measured in the run: the op's is one state read + T snapshot
writes; replay's is one state read + one state write + the side buffer's T tokens read and
T written. Before timing, each cell runs two consecutive steps both ways from the same pool
(step 1 with random num_accepted, step 2 with num_accepted = T) and compares step 2's outputs
(replay vs op and both vs the float64 snapshot recurrence). Timing: CUDA-graph replay,
``triton.testing.do_bench`` medians with L2 flushed (``bench_gdn.bench``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import bench_gdn as bg  # noqa: E402  (sets DEV / TRITON_INTERPRET from --cpu-smoke)
import torch  # noqa: E402

from sndr.kernels.gdn import reference, replay  # noqa: E402

DEV = bg.DEV


#: a CUDA kernel config: lanes per state row, rows per thread, blocks per SM, early L2 prefetch of the
#: block's own tile (0/1), persistent grid (GdnReplay's ``persistent``: "l2", "copy"; None: one tile per
#: block); None in the int fields: GdnReplay's default
Cfg = tuple[int | None, int | None, int | None, int | None, str | None] | tuple[
    int | None, int | None, int | None, int | None, str | None, bool]
DEFAULT_CFG: Cfg = (None, None, None, None, None)
#: the G field's words: the persistent variant, or none
PERSISTENT = {"-": None, "0": None, "l2": "l2", "copy": "copy"}
CFG_HELP = ("PxRxM[xF[xG]][/x]: P lanes per state row, R rows per thread, M blocks per SM, F early L2 prefetch "
            "0/1, G persistent grid: 0 (none: one tile per block), l2 or copy; '-' or a missing field: "
            "GdnReplay's default; '/b': the row sums by one xor butterfly each (GdnReplay's scatter_sums=False; the "
            "default is the reduce-scatter). The split-step field of earlier commits (PxRxMxFxSxG, S 0/1, G 0/1/2) was "
            "removed with the split step (docs/gdn-replay.md): such configs are refused, not reread")
#: the issue's target cells (batch >= 32, T = 2 and 4): timed first, and the only ones --target-configs runs
TARGET_TS = (2, 4)
TARGET_MIN_BATCH = 32
#: an autotune candidate counts only if its outputs are this close to the op's (relative L2; the
#: measured agreement is 1e-5 to 5e-5)
PROBE_MAX_VS_OP = 2e-3


def parse_cfgs(text: str) -> list[Cfg]:
    """Comma-separated configs (``CFG_HELP``); ValueError naming the config and field for anything else."""
    out: list[Cfg] = []
    for c in text.split(","):
        if not c:
            continue
        c, slash, flag = c.partition("/")
        if slash and flag != "b":
            raise ValueError(f"config {c + slash + flag!r}: '/{flag}', not '/b' ({CFG_HELP})")
        parts = c.split("x")
        if len(parts) > 5:
            raise ValueError(f"config {c!r}: {len(parts)} fields, not 5 at most ({CFG_HELP})")
        if len(parts) == 5 and parts[4] not in PERSISTENT:
            raise ValueError(f"config {c!r}: G is {parts[4]!r}, not one of {', '.join(PERSISTENT)} ({CFG_HELP})")
        f: list[int | None] = []
        for name, x in zip("PRMF", parts[:4]):
            if x != "-" and not x.isdigit():
                raise ValueError(f"config {c!r}: {name} is {x!r}, not '-' or a whole number ({CFG_HELP})")
            f.append(None if x == "-" else int(x))
        f += [None] * (4 - len(f))
        cfg: Cfg = (f[0], f[1], f[2], f[3], PERSISTENT[parts[4]] if len(parts) == 5 else None)
        out.append((*cfg, False) if flag else cfg)
    return out


def cfgs_arg(text: str) -> list[Cfg]:
    """``parse_cfgs`` as an argparse type (its message in the usage error)."""
    try:
        return parse_cfgs(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _rel(x, ref) -> float:
    return bg._rel(x, ref)


class ReplayCell:
    """Two steps' inputs on one pool (``bench_gdn.LayerCell``), and a replay side buffer for it."""

    def __init__(self, n: int, t: int, dtype: torch.dtype, backend: str | None = None, cfg: Cfg = DEFAULT_CFG):
        self.c1 = bg.LayerCell(n, t, dtype, seed=0)
        self.c2 = bg.LayerCell(n, t, dtype, seed=1)
        self.n, self.t = n, t
        self.acc_all = torch.full((n,), t, dtype=torch.int32, device=DEV)
        self.new_replay(backend, cfg)

    def new_replay(self, backend: str | None, cfg: Cfg) -> None:
        p, r, minb, pf, pers = cfg[:5]
        kw: dict = {"persistent": pers, "scatter_sums": len(cfg) <= 5 or bool(cfg[5])}
        if pf is not None:
            kw["prefetch"] = bool(pf)
        self.rep = replay.GdnReplay(self.c1.state, bg.H, max_tokens=max(self.t, 2), max_requests=max(self.n, 1),
                                    backend=backend, threads_per_row=p, rows_per_thread=r, min_blocks=minb, **kw)

    def op_step(self, op, c, acc):
        c1 = self.c1
        op(c.mixed, c.a, c.b, c1.A_log, c1.dt_bias, c1.idx, c1.cu, acc, c1.state, c.gate, c1.w, c.out, c1.scale,
           c1.eps, "silu")
        return c.out

    def replay_step(self, c, acc, block_v=None, num_warps=None):
        c1 = self.c1
        return self.rep.step(c.mixed, c.a, c.b, c1.A_log, c1.dt_bias, c1.idx, c1.cu, acc, c1.state, c.gate, c1.w,
                             c.out, c1.scale, c1.eps, "silu", block_v=block_v, num_warps=num_warps)

    def ref_step(self, c, acc, st64):
        c1 = self.c1
        return reference.post_conv_mtp_dense(c.mixed, c.a, c.b, c1.A_log, c1.dt_bias, c1.idx, acc, st64, c.gate,
                                             c1.w, c1.scale, c1.eps, "silu")

    def check(self, op) -> dict:
        c1, c2 = self.c1, self.c2
        s0 = c1.state.clone()
        st64 = s0.double()
        self.ref_step(c1, c1.num_acc, st64)
        o64 = self.ref_step(c2, self.acc_all, st64)
        res = {}
        if op is not None:
            self.op_step(op, c1, c1.num_acc)
            o_op = self.op_step(op, c2, self.acc_all).clone()
            res["op_vs_f64_out"] = _rel(o_op, o64)
        c1.state.copy_(s0)
        self.rep.invalidate(c1.idx[:, 0])
        self.replay_step(c1, c1.num_acc)
        o_rep = self.replay_step(c2, self.acc_all).clone()
        res["replay_vs_f64_out"] = _rel(o_rep, o64)
        # the base the second step wrote: float64's state after step 1's accepted tokens
        if op is not None:
            res["replay_vs_op_out"] = _rel(o_rep, o_op)
        c1.state.copy_(s0)
        self.rep.invalidate(c1.idx[:, 0])
        self.replay_step(c1, self.acc_all)  # steady state for the timing: entries of T tokens everywhere
        return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=bg.OUT)
    ap.add_argument("--batches", type=str, default="1,8,32,64,256")
    ap.add_argument("--ts", type=str, default="2,3,4,5,6,7,8")
    ap.add_argument("--states", type=str, default="float32,bfloat16")
    ap.add_argument("--backend", choices=("cuda", "triton"), default=None,
                    help="replay's backend (default: GdnReplay's choice, the CUDA kernel on a GPU)")
    ap.add_argument("--configs", type=cfgs_arg, default=[],
                    help=f"CUDA kernel configs, comma separated, a row each; default: GdnReplay's. {CFG_HELP}")
    ap.add_argument("--target-configs", type=cfgs_arg, default=[],
                    help="more configs (as --configs), a row each in the target cells only (batch >= 32, T 2 and 4)")
    ap.add_argument("--targets-first", action="store_true",
                    help="time the target cells first (a run cut short still has them); the table is written "
                         "after every cell either way")
    ap.add_argument("--autotune", type=cfgs_arg, default=[],
                    help="CUDA kernel configs (as --configs) timed first per state dtype on the probe cells "
                         "(batch 32 T 2, batch 256 T 4); the best by summed replay/op ratio runs the table")
    ap.add_argument("--no-rand", action="store_true", help="skip the random-acceptance timing")
    ap.add_argument("--rep", type=int, default=60, help="do_bench ms per timed function")
    ap.add_argument("--ncu", action="store_true",
                    help="only one steady-state replay step (every token accepted) and one op call per cell, inside "
                         "an NVTX range 'prof' (for ncu --nvtx --nvtx-include prof/); nothing timed")
    ap.add_argument("--cpu-smoke", action="store_true")
    args = ap.parse_args()
    if args.cpu_smoke:
        bg.H, bg.HV, bg.K, bg.V = 2, 4, 16, 16
        batches, ts, rep = (1, 2), (2,), 1
    else:
        batches = tuple(int(x) for x in args.batches.split(","))
        ts = tuple(int(x) for x in args.ts.split(","))
        rep = args.rep
    args.out.mkdir(parents=True, exist_ok=True)
    dl = bg.device_line()
    bw = bg.copy_bandwidth()
    op, op_note = bg.load_cuda_op()
    bg.log(f"device: {dl}\ncopy bandwidth (read + write): {bw:.0f} GB/s\nvLLM CUDA op: {op_note}")
    configs = args.configs or [DEFAULT_CFG]
    if args.ncu:
        for dtype in [getattr(torch, x) for x in args.states.split(",")]:
            for n in batches:
                for t in ts:
                    ncu_cell(ReplayCell(n, t, dtype, args.backend, configs[0]), op)
        return 0
    target_cfgs = args.target_configs
    rows: list[dict] = []
    probes: list[dict] = []
    tuned: dict = {}

    def write(final: bool = False) -> None:
        result = {"device": dl, "copy_GBps": bw, "cuda_op": op_note, "cmd": " ".join(sys.argv), "rows": rows,
                  "autotune": tuned, "probes": probes, "complete": final}
        (args.out / "bench_gdn_replay.json").write_text(json.dumps(result, indent=1))
        text = (f"device: {dl}\ncopy bandwidth {bw:.0f} GB/s\ncommand: {' '.join(sys.argv)}\n"
                f"{'' if final else '(partial: written after each cell)'}\n\n" + fmt(rows))
        (args.out / "bench_gdn_replay.md").write_text(text)
        if final:
            bg.log(text)

    dtypes = [getattr(torch, s) for s in args.states.split(",")]
    per_dtype: dict = {}  # the autotune's choice per pool dtype
    for dtype in dtypes:
        if args.autotune:
            score: dict[Cfg, float] = {}
            for n, t in ((1, 2),) if args.cpu_smoke else ((32, 2), (256, 4)):
                cell = ReplayCell(n, t, dtype, args.backend)
                op_us = None
                for cfg in args.autotune:
                    cell.new_replay(args.backend, cfg)
                    row = one_row(cell, op, op_us, bw, 25, True)
                    op_us = row.get("op_graph")
                    row["probe_cfg"] = list(cfg)
                    probes.append(row)
                    bg.log("probe " + json.dumps(row))
                    ck = row.get("check", {})
                    if "ratio" in row and ck.get("replay_vs_op_out", 1.0) <= PROBE_MAX_VS_OP:
                        score[cfg] = score.get(cfg, 0.0) + row["ratio"]
                    else:  # a config that failed, was not timed or disagreed with the op is never chosen
                        score[cfg] = float("inf")
                del cell
            best = min(score, key=lambda c: score[c]) if score else DEFAULT_CFG
            if score and score[best] == float("inf"):  # nothing timed against the op (the CPU smoke)
                best = DEFAULT_CFG
            tuned[str(dtype)] = {"chosen": list(best), "scores": {"x".join(map(str, c)): v for c, v in score.items()}}
            per_dtype[dtype] = [best]
            bg.log(f"autotune {dtype}: {tuned[str(dtype)]}")
    cells = [(dtype, n, t) for dtype in dtypes for n in batches for t in ts]
    if args.targets_first:  # both pool dtypes' target cells before any other
        cells.sort(key=lambda c: not is_target(c[1], c[2]))
    for dtype, n, t in cells:
        cfgs = per_dtype.get(dtype, configs)
        cell = ReplayCell(n, t, dtype, args.backend, cfgs[0])
        op_us = None
        for ci, cfg in enumerate(cfgs + (target_cfgs if is_target(n, t) else [])):
            if ci:
                cell.new_replay(args.backend, cfg)
            row = one_row(cell, op, op_us, bw, rep, args.no_rand)
            op_us = row.get("op_graph")
            rows.append(row)
            bg.log(json.dumps(row))
        del cell
        if DEV == "cuda":
            torch.cuda.empty_cache()
        write()
    rows.sort(key=lambda r: (r["state"] != "float32", r["batch"], r["T"]))  # stable: configs stay in order
    write(final=True)
    return 0


def ncu_cell(cell: ReplayCell, op) -> None:
    """One steady-state replay step (side entries of T tokens, every token accepted) and one op call in the NVTX
    range ``prof``, each compiled and warmed up before it."""
    c1 = cell.c1
    cell.rep.invalidate(c1.idx[:, 0])
    cell.replay_step(c1, cell.acc_all)  # compiles; leaves entries of T tokens everywhere
    cell.replay_step(cell.c2, cell.acc_all)
    if op is not None:
        cell.op_step(op, cell.c2, cell.acc_all)
    if DEV == "cuda":
        torch.cuda.synchronize()
        torch.cuda.nvtx.range_push("prof")
    bg.log(f"ncu replay cell {c1.state.dtype} batch {cell.n} T {cell.t}: {cell.rep.backend} step, then the op")
    cell.replay_step(cell.c2, cell.acc_all)
    if op is not None:
        cell.op_step(op, cell.c2, cell.acc_all)
    if DEV == "cuda":
        torch.cuda.synchronize()
        torch.cuda.nvtx.range_pop()


def is_target(n: int, t: int) -> bool:
    return n >= TARGET_MIN_BATCH and t in TARGET_TS


def one_row(cell: ReplayCell, op, op_us, bw: float, rep: int, no_rand: bool) -> dict:
    """One cell and replay config: the checks, then the graph-replay timings (the op's reused from op_us)."""
    n, t = cell.n, cell.t
    sb = cell.c1.state_bytes()
    side = n * cell.rep.side_bytes_per_token() * t * 2
    r = cell.rep
    row = {"state": str(cell.c1.state.dtype).split(".")[-1], "batch": n, "T": t,
           "op_bound_us": (1 + t) * sb / (bw * 1e9) * 1e6, "replay_bound_us": (2 * sb + side) / (bw * 1e9) * 1e6,
           "backend": r.backend,
           "config": (f"P={r.P} R={r.R} minb={r.min_blocks}"
                      + (f" persistent-{r.persistent}" if r.persistent else " one-kernel")
                      + ("" if r.prefetch or r.persistent == "l2" else " no-prefetch")
                      + ("" if r.scatter_sums else " butterfly-sums")
                      if r.backend == "cuda" else f"block_v={r.block_v(n)}")}
    try:
        row["check"] = cell.check(op)
    except Exception as exc:  # noqa: BLE001 - reported in the row
        row["check_error"] = f"{type(exc).__name__}: {exc}"[:300]
    if r.backend == "cuda" and DEV == "cuda":
        k = r._cuda_kernel(replay.PERSISTENT_KERNELS[r.persistent] if r.persistent else "gdn_replay_step",
                           {"AB_KIND": 2, "Z_KIND": 2, "W_KIND": 2, "O_KIND": 2})
        row["regs"], row["spill_bytes"], row["blocks_per_sm"] = k.registers, k.spill_bytes, k.blocks_per_sm(
            r.threads)
    bg.timed(row, "replay_graph", lambda c=cell: c.replay_step(c.c2, c.acc_all), True, rep)
    if not no_rand:  # the same with num_accepted random in [1, T] (bench_gdn.LayerCell's): less replay work
        bg.timed(row, "replay_rand_graph", lambda c=cell: c.replay_step(c.c2, c.c1.num_acc), True, rep)
    if op is not None and op_us is None:
        bg.timed(row, "op_graph", lambda c=cell: c.op_step(op, c.c2, c.acc_all), True, rep)
    elif op_us is not None:
        row["op_graph"] = op_us
    if row.get("replay_graph") and row.get("op_graph"):
        row["ratio"] = row["replay_graph"] / row["op_graph"]
        if row.get("replay_rand_graph"):
            row["ratio_rand"] = row["replay_rand_graph"] / row["op_graph"]
    row["mean_accepted"] = float(cell.c1.num_acc.float().mean())
    return row


def fmt(rows) -> str:
    out = ["| state | batch | T | replay kernel | op bound µs | replay bound µs | bound ratio | op µs | replay µs | replay/op "
           "| target | replay µs, random acc (mean) | ratio | replay vs f64 | op vs f64 |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ratio = r.get("ratio")
        target = {2: 0.85, 4: 0.6}.get(r["T"]) if r["batch"] >= 32 else None
        verdict = "" if target is None or ratio is None else ("hit" if ratio <= target else "miss") + f" (≤ {target})"
        ck = r.get("check", {})
        out.append(
            f"| {r['state']} | {r['batch']} | {r['T']} | {r.get('backend', '')} {r.get('config', '')} "
            f"| {r['op_bound_us']:.1f} | {r['replay_bound_us']:.1f} "
            f"| {r['replay_bound_us'] / r['op_bound_us']:.2f} | {r.get('op_graph', float('nan')):.1f} "
            f"| {r.get('replay_graph', float('nan')):.1f} | {ratio if ratio is None else f'{ratio:.2f}'} | {verdict} "
            f"| {r.get('replay_rand_graph', float('nan')):.1f} ({r.get('mean_accepted', float('nan')):.1f}) "
            f"| {r.get('ratio_rand', float('nan')):.2f} "
            f"| {ck.get('replay_vs_f64_out', float('nan')):.1e} | {ck.get('op_vs_f64_out', float('nan')):.1e} |")
    return "\n".join(out)


if __name__ == "__main__":
    raise SystemExit(main())
