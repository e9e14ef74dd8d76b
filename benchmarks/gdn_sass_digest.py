"""SHA-256 of each kernel's SASS in every shipped GDN build (CPU only: NVRTC + cuobjdump).

Shows that a source refactor of ``step.cu`` / ``replay.cu`` / ``rows.cuh`` left the machine code
unchanged: run it before and after and diff the output (``tq_sass_digest.py``'s twin; the helpers are
``_sass.py``'s).

    python3 benchmarks/gdn_sass_digest.py > before.txt   # on the old tree
    python3 benchmarks/gdn_sass_digest.py > after.txt    # on the new tree
    diff before.txt after.txt

Builds, all sm_90 at the measured head shape (H, HV, K, V = 16, 32, 128, 128):

* ``step``: PK0003's fused step (``cuda_step``) at every launch shape it can launch: those of
  ``routing.CUDA_SHAPES`` (what ``pick_config`` ships), ``bench_gdn.CUDA_CANDIDATES`` (what the benchmark
  routes from), ``cuda_step.TWIN_SHAPES`` (the shapes beside the register tile)
  and ``default_config``; both pool dtypes
  (float32, bfloat16); TM 1 (the packed decode) and 2, 4, 8 (the MTP op's call: T = 2..8); each in the
  layer's call (bf16 activations, SiLU gate, int32 indices) and ``test_cuda_step``'s other variant (fp16,
  sigmoid, int64). Shapes ``config_why`` refuses are left out (counted on stderr).
* ``replay``: PK0004's replayed verify, each kernel compiled alone as ``GdnReplay`` builds it
  (``GdnReplay.cuda_defines``; KSEL 0-3: the step, its two persistent variants, the materialize kernel):
  both pool dtypes, ``GdnReplay``'s default rows per thread and the other one the benchmark times
  (``test_gdn_replay``'s STEP_CFGS), TM 2, 4, 8, the layer's call (bf16, SiLU) and fp16 with the sigmoid
  gate (the materialize kernel takes no call kinds: once).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _sass import print_digests  # noqa: E402

H, HV, K, V = 16, 32, 128, 128
TMS = (1, 2, 4, 8)  # the TM values routing.TS gives (T = 1, 2, 3-4, 6-8)


def step_shapes() -> list[str]:
    import bench_gdn

    from sndr.kernels.gdn import cuda_step, routing

    shipped = {label for per_t in routing.CUDA_SHAPES.values() for per_b in per_t.values() for label in per_b.values()}
    return sorted(shipped | set(bench_gdn.CUDA_CANDIDATES) | set(cuda_step.TWIN_SHAPES)
                  | {cuda_step.default_config(V, K).label()})


def step_builds(refused: list[str]):
    import torch

    from sndr.kernels.gdn import cuda_step

    variants = [dict(x=2, gate=0, i64=False, tag="bf16x"), dict(x=1, gate=1, i64=True, tag="fp16x sig i64")]
    src = cuda_step.source()
    for label in step_shapes():
        cfg = cuda_step.CudaConfig.parse(label)
        for dt, s_kind in ((torch.float32, 0), (torch.bfloat16, 2)):
            why = cuda_step.config_why(K, V, dt, cfg)
            if why:
                refused.append(f"step {label} {dt}: {why}")
                continue
            for tm in TMS:
                for v in variants:
                    kinds = {"X_KIND": v["x"], "AB_KIND": v["x"], "ALOG_KIND": 0, "DT_KIND": 0, "Z_KIND": v["x"],
                             "W_KIND": 2, "O_KIND": v["x"], "S_KIND": s_kind}
                    defs = cuda_step.defines(H, HV, K, V, cfg, spec=tm > 1, tm=tm, kinds=kinds,
                                             sigmoid_gate=bool(v["gate"]), idx64=v["i64"], acc64=v["i64"],
                                             cu64=v["i64"])
                    yield (f"step {label} s{s_kind} tm{tm} {v['tag']} sm90", src, "gdn_step", "90", defs)


def replay_builds():
    import torch

    from sndr.kernels.gdn import replay

    src = replay.cuda_source()
    # (activation dtype, the call's kinds): the layer's call (bf16, SiLU) and fp16 with the sigmoid gate
    calls = [(torch.bfloat16, "bf16x", dict.fromkeys(("AB_KIND", "Z_KIND", "W_KIND", "O_KIND"), 2)),
             (torch.float16, "fp16x sig", {**dict.fromkeys(("AB_KIND", "Z_KIND", "O_KIND"), 1), "W_KIND": 2,
                                           "SIGMOID_GATE": 1})]
    for dt in (torch.float32, torch.bfloat16):
        pool = torch.zeros(1, HV, V, K, dtype=dt)
        default_r = replay.GdnReplay(pool, H, max_tokens=2, max_requests=1, backend="triton").R
        for r in (None, 4 if default_r == 2 else 2):  # GdnReplay's default, then the benchmark's other R
            for tm in (2, 4, 8):
                for act, tag, kinds in calls:
                    rep = replay.GdnReplay(pool, H, max_tokens=tm, max_requests=1, act_dtype=act, backend="triton",
                                           rows_per_thread=r)
                    names = ["gdn_replay_step", *replay.PERSISTENT_KERNELS.values()]
                    for name in names + (["gdn_replay_materialize"] if act == torch.bfloat16 else []):
                        defs = rep.cuda_defines(name, {} if name == "gdn_replay_materialize" else kinds)
                        yield (f"replay s{defs['S_KIND']} P{rep.P} R{rep.R} m{rep.min_blocks} pf{int(rep.prefetch)} "
                               f"tm{rep.TM} {tag} ksel{defs['KSEL']} sm90", src, "gdn_replay", "90", defs)


def main(argv=None) -> int:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default="", help="only builds whose label contains this")
    args = ap.parse_args(argv)
    refused: list[str] = []
    builds = list(step_builds(refused)) + list(replay_builds())
    for line in refused:
        print(f"left out: {line}", file=sys.stderr)
    print_digests(builds, args.only)
    return 0


if __name__ == "__main__":
    sys.exit(main())
