"""SHA-256 of each kernel's SASS in every shipped k8v4 build (CPU only: NVRTC + cuobjdump).

Shows that a source refactor of ``decode_k8v4.cu`` / ``verify_k8v4.cu`` left the
machine code unchanged: run it before and after and diff the output.

    python3 benchmarks/tq_sass_digest.py > before.txt   # on the old tree
    python3 benchmarks/tq_sass_digest.py > after.txt    # on the new tree
    diff before.txt after.txt

Builds: the decode configs of ``tests/kernels/test_tq_cuda.py``'s SHAPES (page
kernel on sm_90, warp kernel on sm_90 and sm_89, shipped DEFAULT; at 8 KV heads
and head dim 128 / 256 also the in-kernel merges, cluster=2 and grid_merge) and the verify
configs of ``tests/kernels/test_mtp_verify.py``'s no-spill test (GRID, OTHER,
PLANNED). Addresses and the source hash do not enter SASS, so equal digests
mean equal instructions.

``--tile`` prints, instead of digests, the verify kernel's instructions on the
path of one unmasked tile without a rescale (from the tile's first instruction
after the masked/unmasked branch to the loop's back edge, the lazy-rescale
block skipped), by opcode and by role; ``--softmax N`` builds the verify
configs with ``VerifyConfig.softmax = N``:

    python3 benchmarks/tq_sass_digest.py --only "g8 k3 p16 bf16=1 cfg-1" --tile --softmax 0
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _sass import print_digests, sass_by_function  # noqa: E402  (the SASS helpers gdn_sass_digest.py shares)

from sndr.kernels import _cudart  # noqa: E402
from sndr.kernels.turboquant_k8v4 import cuda_decode  # noqa: E402


def _op(ins: str) -> str:
    return re.sub(r"^@!?U?P\w+\s+", "", ins).split()[0]


def _target(ins: str) -> int | None:
    m = re.search(r"BRA (?:\S+ )?0x([0-9a-f]+)", ins)
    return int(m.group(1), 16) if m else None


def tile_path(sass: str) -> list[str]:
    """The unmasked tile's instructions (see the module doc): the branch before the first HMMA picks the
    unmasked copy of attend_tile_causal; its VOTE.ANY's branch skips the rescale block; the loop's back edge
    ends it."""
    code = []
    for line in sass.splitlines():
        m = re.match(r"/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;", line)
        if m:
            code.append((int(m.group(1), 16), m.group(2)))
    addr = [a for a, _ in code]
    first = next(i for i, (_, s) in enumerate(code) if _op(s).startswith("HMMA"))
    br = max(i for i in range(first) if code[i][1].startswith("@") and _target(code[i][1]) is not None)
    start = addr.index(_target(code[br][1]) or 0)
    vote = next(i for i in range(start, len(code)) if _op(code[i][1]).startswith("VOTE.ANY"))
    skip = next(i for i in range(vote + 1, vote + 4) if _target(code[i][1]) is not None)
    resume = addr.index(_target(code[skip][1]) or 0)
    back = next(i for i in range(resume, len(code)) if (_target(code[i][1]) or 1 << 40) < addr[first] - 0x100)
    return [s for _, s in code[start:skip + 1] + code[resume:back + 1]]


def role(ins: str) -> str:
    op = _op(ins)
    if op.startswith("HMMA"):
        return "mma"
    if op.startswith("LDS"):
        return "shared loads"
    if "E4M3" in op:
        return "key cvt"
    if op.startswith(("SHF", "PRMT", "LOP3")):
        return "shift/prmt/lop3"
    if op in ("MOV", "CS2R") or op.startswith("IMAD.MOV"):
        return "moves"
    if op.split(".")[0] in ("FMUL", "FADD", "FFMA", "FMNMX", "FSETP", "MUFU", "F2FP", "MOVM", "HMUL2", "HADD2", "VOTE",
                            "PLOP3", "BRA", "BSSY", "BSYNC"):
        return "softmax"
    return "other"


def decode_builds():
    from test_tq_cuda import SHAPES, _shape  # the shapes the no-spill test compiles

    for d, hk, g, page, bf16 in SHAPES:
        q, cache = _shape(d, hk, g, page, bf16)
        builds = [("90", cuda_decode.DEFAULT)]
        if (d, hk) in ((128, 8), (256, 8)):  # the page kernels that merge in-kernel: cluster (CL) and grid (GM)
            builds += [("90", cuda_decode.CudaConfig(cluster=2)), ("90", cuda_decode.CudaConfig(grid_merge=True))]
        if d <= 128:
            builds += [("90", cuda_decode.CudaConfig(kind="warp")), ("89", cuda_decode.CudaConfig(kind="warp"))]
        for arch, cfg in builds:
            extra = " cl2" if cfg.cluster else " gm" if cfg.grid_merge else ""
            yield (f"decode d{d} hk{hk} g{g} p{page} bf16={int(bf16)} sm{arch} {cfg.kind}{extra}",
                   cuda_decode.SOURCE_PATH.read_text(), cuda_decode.KERNELS[cfg.kind], arch,
                   cuda_decode.defines(q, cache, cfg))


def verify_builds(softmax: int | None = None):
    import dataclasses

    from test_mtp_verify import GRID, OTHER, PLAN_CFGS, PLANNED  # the builds the verify no-spill test compiles

    from sndr.kernels.turboquant_k8v4 import mtp_verify as mv
    from sndr.kernels.turboquant_k8v4._layout import Layout

    for d, hk, g, k, page, bf16, cfg in [s + (-1,) for s in GRID + OTHER] + PLANNED:
        sp = hk * Layout(d).slot_size_aligned
        c = mv.DEFAULT if cfg < 0 else PLAN_CFGS[cfg]
        if softmax is not None:
            c = dataclasses.replace(c, softmax=softmax)
        defs = mv.defines(hk * g, hk, d, page, sp, bf16, k + 1, c)
        arch = "90" + mv.arch_suffix(defs)  # (sm_90a: the warp-specialised pair)
        yield (f"verify d{d} hk{hk} g{g} k{k} p{page} bf16={int(bf16)} cfg{cfg} sm{arch}", mv.source(), mv.KERNEL,
               arch, defs)


def main(argv=None) -> int:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default="", help="only builds whose label contains this")
    ap.add_argument("--tile", action="store_true", help="the verify kernel's unmasked tile path, counted")
    ap.add_argument("--softmax", type=int, default=None, help="verify builds with VerifyConfig.softmax = N")
    args = ap.parse_args(argv)
    builds = ([] if args.tile else list(decode_builds())) + list(verify_builds(args.softmax))
    if not args.tile:
        print_digests(builds, args.only)
        return 0
    import collections

    for label, src, name, arch, defs in builds:
        if args.only not in label:
            continue
        path = tile_path(sass_by_function(_cudart.compile_cubin(src, name, arch, defs, cache=False))[name])
        roles = collections.Counter(role(s) for s in path)
        ops = collections.Counter(_op(s).split(".")[0] for s in path)
        print(f"{label} SMX={defs['SMX']}: {len(path)} instructions a tile; by role {dict(roles.most_common())}; "
              f"by opcode {dict(ops.most_common())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
