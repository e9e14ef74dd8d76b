"""Where PK0003 takes vLLM's default-path GDN calls: the measured winning cells (their one home).

vLLM 0.32.0's default path (``VLLM_GDN_DECODE_KERNEL=cuda``) runs a pure spec-verify
batch through its fused CUDA op and a plain-decode batch through its Triton packed
decode and then the gated RMSNorm. sndr's fused step (``vllm_entry.try_post_conv_mtp``,
``vllm_entry.try_packed_decode_norm``) takes such a call only in a cell where the committed
benchmark (``docs/bench-gdn-h200.md``, ``benchmarks/bench_gdn.py``) measured it faster
than vLLM's default path: :data:`WINS`, per state dtype and mode (CUDA-graph capture, or
an eager call), the batches of each T where sndr / vLLM's default printed below 1.00.
``tests/kernels/test_gdn_routing.py`` checks that :data:`WINS` equals the doc's tables;
``bench_gdn.py`` writes the :data:`WINS` of its run next to its tables.

Between measured points a call is taken only where every measured neighbour won: batch
``n`` between two measured batches needs both (batch 16: 8 and 32), T = 5 and 7 need
T = 4 and 6 / 6 and 8; beyond the largest measured batch (256) or T (8) nothing is
taken. Every other call keeps vLLM's path, logged once per (entry, reason). (One exception,
in ``vllm_entry``: where only the graph cell won, the first eager call of a layout, vLLM's
warm-up before it captures that size, runs sndr's step once so that its kernel is compiled
and its canary passed before the capture.)

On by default (no ``SNDR_ENABLE_PK0003=1``) the cells apply only on the GPU class that
was measured (:data:`MEASURED_CAPABILITIES`: the H200, sm_90); an explicit opt-in takes
every sm_80+ GPU, still only in the winning cells.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

#: The GPU capabilities PK0003's benchmark measured (docs/bench-gdn-h200.md: H200, sm_90).
MEASURED_CAPABILITIES = ((9, 0),)
BATCHES = (1, 8, 32, 64, 256)
TS = (1, 2, 3, 4, 6, 8)
MODES = ("graph", "eager")

# (state dtype, mode) -> {T: measured batches where sndr / vLLM's default path < 1.00}
# Written from the run of docs/bench-gdn-h200.md (bench_gdn.py prints it as routing_wins.txt).
WINS: dict[tuple[str, str], dict[int, tuple[int, ...]]] = {
    ("float32", "graph"): {1: (1, 8, 32, 64, 256), 2: (1, 8, 32, 64, 256), 3: (1, 8, 32, 64, 256), 4: (1, 8, 32, 64, 256), 6: (1, 8, 32, 64, 256), 8: (1, 8, 32, 64, 256)},
    ("float32", "eager"): {1: (1, 8, 32, 64, 256), 2: (32, 64, 256), 3: (8, 32, 64, 256), 4: (8, 32, 64, 256), 6: (8, 32, 64, 256), 8: (8, 32, 64, 256)},
    ("bfloat16", "graph"): {1: (1, 8, 32, 64), 2: (1, 8, 32, 64, 256), 3: (1, 8, 32, 64, 256), 4: (1, 8, 32, 64, 256), 6: (1, 8, 32, 64, 256), 8: (1, 8, 32, 64, 256)},
    ("bfloat16", "eager"): {1: (1, 8, 32, 64, 256), 2: (1, 8, 32, 64, 256), 3: (1, 8, 32, 64, 256), 4: (8, 32, 64, 256), 6: (8, 32, 64, 256), 8: (1, 8, 32, 64, 256)},
}

# (state dtype, mode) -> {T: measured batches where the taken call runs the CUDA step (step.cu, cuda_step)}:
# the cells of WINS where it measured faster than the Triton step (written by the same run, bench_gdn.py's
# routing_wins.txt). Everywhere else a taken call runs the Triton step.
CUDA: dict[tuple[str, str], dict[int, tuple[int, ...]]] = {
    ("float32", "graph"): {1: (1, 8, 256), 2: (1, 8, 32, 64, 256), 3: (1, 8, 32, 64, 256), 4: (1, 8, 32, 64, 256), 6: (1, 8, 32, 64, 256), 8: (1, 8, 32, 64, 256)},
    ("float32", "eager"): {1: (1, 8, 32, 256), 2: (32, 64, 256), 3: (8, 32, 64, 256), 4: (8, 32, 64, 256), 6: (8, 32, 64, 256), 8: (8, 32, 64, 256)},
    ("bfloat16", "graph"): {1: (1, 8), 2: (1, 8, 32, 64, 256), 3: (1, 8, 32, 64, 256), 4: (1, 8, 32, 64, 256), 6: (1, 8, 32, 64, 256), 8: (1, 8, 32, 64, 256)},
    ("bfloat16", "eager"): {1: (1, 8, 256), 2: (1, 8, 32, 64, 256), 3: (1, 8, 32, 64, 256), 4: (8, 32, 64, 256), 6: (8, 32, 64, 256), 8: (1, 8, 32, 64, 256)},
}
# state dtype -> {T: {batch: the CUDA step's launch shape (cuda_step.CudaConfig.label) that replayed fastest
# among bench_gdn.py's candidates in that cell}}: what cuda_step.pick_config launches there.
CUDA_SHAPES: dict[str, dict[int, dict[int, str]]] = {
    "float32": {
        1: {1: "16x8x1t128m8cax", 8: "64x8x4t128m4cagx", 32: "64x8x1t128m8a", 64: "64x8x1t128m8a", 256: "128x16x4t512m2bx"},
        2: {1: "16x8x1t128m8ca", 8: "64x8x4t128m4cag", 32: "64x8x4t128m4cag", 64: "64x8x4t128m4cag", 256: "128x16x4t512m2cb"},
        3: {1: "16x8x1t128m8cax", 8: "64x8x4t128m4cag", 32: "128x16x4t512m2cbx", 64: "128x16x4t512m2cbx", 256: "128x16x4t512m2cb"},
        4: {1: "16x8x1t128m8cax", 8: "64x8x4t128m4cag", 32: "128x16x4t512m2cbx", 64: "128x16x4t512m2cb", 256: "128x16x4t512m2cbx"},
        6: {1: "16x8x1t128m8cax", 8: "128x8x4t256m2cg", 32: "128x16x4t512m2cbx", 64: "128x16x4t512m2cbx", 256: "128x16x4t512m2bx"},
        8: {1: "16x8x1t128m8cax", 8: "128x16x4t512m2cbx", 32: "128x16x4t512m2bx", 64: "128x16x4t512m2cbx", 256: "128x16x4t512m2cb"},
    },
    "bfloat16": {
        1: {1: "32x8x4t64m8cax", 8: "64x8x4t128m4ca", 32: "128x8x2t256m4bx", 64: "128x8x2t256m4bx", 256: "128x8x2t256m4bx"},
        2: {1: "64x8x4t128m4cagx", 8: "64x8x4t128m4cag", 32: "64x8x4t128m5cagx", 64: "64x8x4t128m5cagx", 256: "128x8x2t256m4cbgx"},
        3: {1: "64x8x4t128m4cag", 8: "64x8x4t128m4cagx", 32: "64x8x4t128m4cagx", 64: "64x8x4t128m4cagx", 256: "128x8x2t256m4cbgx"},
        4: {1: "64x8x4t128m4cag", 8: "128x8x4t256m2cgx", 32: "64x8x4t128m4cagx", 64: "64x8x4t128m4cagx", 256: "128x8x2t256m4cbgx"},
        6: {1: "16x8x1t128m8ca", 8: "128x8x4t256m2cg", 32: "128x8x4t256m2cgx", 64: "128x8x2t256m4cbg", 256: "128x8x2t256m4cbgx"},
        8: {1: "16x8x1t128m8cax", 8: "128x8x2t256m4cbgx", 32: "128x8x4t256m2cgx", 64: "128x16x4t512m2cbx", 256: "128x16x4t512m2cbx"},
    },
}

_MEASURING = [False]
_FORCED: list[str | None] = [None]


@contextlib.contextmanager
def measuring(kernel: str | None = None) -> Iterator[None]:
    """Every cell taken, as an explicit opt-in would take it on a measured GPU: for the benchmark that
    measures the cells (and the tests that compare sndr with vLLM in cells it loses). ``kernel``
    (``"cuda"`` / ``"triton"``): every taken CUDA call runs that step, whatever :data:`CUDA` says."""
    _MEASURING.append(True)
    _FORCED.append(kernel)
    try:
        yield
    finally:
        _MEASURING.pop()
        _FORCED.pop()


def kernel_for(state_dtype: str, mode: str, n: int, t: int) -> str:
    """``"cuda"`` where every measured cell around (``n``, ``t``) routes to the CUDA step (:data:`CUDA`),
    else ``"triton"``."""
    forced = _FORCED[-1]
    if forced is not None:
        return forced
    cells = CUDA.get((state_dtype, mode))
    ns, ts = _bracket(n, BATCHES), _bracket(t, TS)
    if not cells or ns is None or ts is None:
        return "triton"
    return "cuda" if all(b in cells.get(tt, ()) for tt in ts for b in ns) else "triton"


def _bracket(x: int, points: tuple[int, ...]) -> tuple[int, ...] | None:
    """The measured points around ``x`` (one where ``x`` is measured), None outside them."""
    if x < points[0] or x > points[-1]:
        return None
    if x in points:
        return (x,)
    hi = next(p for p in points if p > x)
    lo = max(p for p in points if p < x)
    return (lo, hi)


def cell_why(state_dtype: str, mode: str, n: int, t: int) -> str | None:
    """None where sndr takes a call of ``n`` requests with ``t`` tokens each (a ``state_dtype`` pool:
    ``"float32"`` / ``"bfloat16"``; ``mode`` ``"graph"`` or ``"eager"``), else why not."""
    if _MEASURING[-1]:
        return None
    wins = WINS.get((state_dtype, mode))
    if wins is None:
        return f"{state_dtype} state is not measured"
    ns, ts = _bracket(n, BATCHES), _bracket(t, TS)
    if ns is None or ts is None:
        return (f"batch {n}, T = {t} is outside the measured cells (batch {BATCHES[0]}-{BATCHES[-1]}, "
                f"T = {TS[0]}-{TS[-1]})")
    lost = [(b, tt) for tt in ts for b in ns if b not in wins.get(tt, ())]
    if lost:
        cells = ", ".join(f"batch {b} T = {tt}" for b, tt in lost)
        return (f"{state_dtype} state, {mode}: vLLM's default path measured faster at {cells} "
                "(docs/bench-gdn-h200.md)")
    return None


def cuda_shape(state_dtype: str, n: int, t: int) -> str | None:
    """The measured CUDA launch shape (:data:`CUDA_SHAPES`) of the cell nearest to (``n``, ``t``): the largest
    measured T <= ``t`` (else the smallest), then the largest measured batch <= ``n`` (else the smallest)."""
    per_t = CUDA_SHAPES.get(state_dtype)
    if not per_t:
        return None
    ts = sorted(per_t)
    tt = max((x for x in ts if x <= t), default=ts[0])
    per_b = per_t[tt]
    if not per_b:
        return None
    bs = sorted(per_b)
    return per_b[max((b for b in bs if b <= n), default=bs[0])]


def shapes_literal(rows: list[dict]) -> str:
    """:data:`CUDA_SHAPES` as Python source, from a benchmark run's rows (their ``cuda_shape``)."""
    out: dict[str, dict[int, dict[int, str]]] = {}
    for r in rows:
        if r.get("cuda_shape"):
            out.setdefault(r["state_dtype"], {}).setdefault(int(r["T"]), {})[int(r["batch"])] = r["cuda_shape"]
    lines = ["CUDA_SHAPES: dict[str, dict[int, dict[int, str]]] = {"]
    for dt, per_t in out.items():
        lines.append(f'    "{dt}": {{')
        for t, per_b in sorted(per_t.items()):
            body = ", ".join(f'{b}: "{sh}"' for b, sh in sorted(per_b.items()))
            lines.append(f"        {t}: {{{body}}},")
        lines.append("    },")
    lines.append("}")
    return "\n".join(lines)


def capability_why(capability: tuple[int, int] | None, explicit: bool) -> str | None:
    """None where the cells apply on this GPU (``capability`` None: not an NVIDIA GPU), else why not."""
    if _MEASURING[-1] or explicit:
        return None
    if capability is None or tuple(capability) not in MEASURED_CAPABILITIES:
        where = "not an NVIDIA GPU" if capability is None else f"sm_{capability[0]}{capability[1]}"
        return (f"{where} is outside the measured default set (sm_90); SNDR_ENABLE_PK0003=1 takes the winning "
                "cells there")
    return None


def explicit_opt_in() -> bool:
    """``SNDR_ENABLE_PK0003=1`` is set: the operator asked for the plugin, beyond its measured GPU class and
    on vLLM's Triton fallback kernels too."""
    from ... import env as sndr_env

    try:
        return sndr_env.enable_override("PK0003") is True
    except Exception:  # noqa: BLE001 - a malformed value was refused at startup already; take the default scope
        return False


def wins_literal(rows: list[dict], name: str = "WINS") -> str:
    """:data:`WINS` as Python source, from a benchmark run's rows (``bench_gdn.py``'s ``rows``).

    ``name="CUDA"``: :data:`CUDA`, the winning cells whose row's ``kernel_<mode>`` is ``"cuda"``."""
    out: dict[tuple[str, str], dict[int, list[int]]] = {}
    for r in rows:
        for mode in MODES:
            ratio = r.get(f"ratio_{mode}")
            per_t = out.setdefault((r["state_dtype"], mode), {})
            cell = per_t.setdefault(int(r["T"]), [])
            if ratio is not None and round(ratio, 2) < 1.0 and (name != "CUDA" or r.get(f"kernel_{mode}") == "cuda"):
                cell.append(int(r["batch"]))
    lines = [f"{name}: dict[tuple[str, str], dict[int, tuple[int, ...]]] = {{"]
    for (dt, mode), per_t in out.items():
        body = ", ".join(f"{t}: ({', '.join(map(str, sorted(bs)))}{',' if len(bs) == 1 else ''})"
                         for t, bs in sorted(per_t.items()))
        lines.append(f"    ({dt!r}, {mode!r}): {{{body}}},".replace("'", '"'))
    lines.append("}")
    return "\n".join(lines)
