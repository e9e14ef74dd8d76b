"""SHA-256 of each kernel's SASS in every shipped k8v4 build (CPU only: NVRTC + cuobjdump).

Shows that a source refactor of ``decode_k8v4.cu`` / ``verify_k8v4.cu`` left the
machine code unchanged: run it before and after and diff the output.

    python3 benchmarks/tq_sass_digest.py > before.txt   # on the old tree
    python3 benchmarks/tq_sass_digest.py > after.txt    # on the new tree
    diff before.txt after.txt

Builds: the decode configs of ``tests/kernels/test_tq_cuda.py``'s SHAPES (page
kernel on sm_90, warp kernel on sm_90 and sm_89, shipped DEFAULT) and the verify
configs of ``tests/kernels/test_mtp_verify.py``'s no-spill test (GRID, OTHER,
PLANNED). Addresses and the source hash do not enter SASS, so equal digests
mean equal instructions.
"""

from __future__ import annotations

import hashlib
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "kernels"))

from sndr.kernels import _cudart  # noqa: E402
from sndr.kernels.turboquant_k8v4 import cuda_decode  # noqa: E402


def cuobjdump() -> str:
    import shutil

    import triton

    p = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    return str(p) if p.is_file() else (shutil.which("cuobjdump") or "cuobjdump")


def sass_by_function(cubin: bytes) -> dict[str, str]:
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        text = subprocess.run([cuobjdump(), "-sass", f.name], capture_output=True, text=True, check=True).stdout
    out: dict[str, list[str]] = {}
    cur = None
    for line in text.splitlines():
        m = re.match(r"\s*Function : (\w+)", line)
        if m:
            cur = m.group(1)
            out[cur] = []
        elif cur and re.match(r"\s*/\*[0-9a-f]{4}\*/", line):
            out[cur].append(line.strip())
    return {k: "\n".join(v) for k, v in out.items()}


def decode_builds():
    from test_tq_cuda import SHAPES, _shape  # the shapes the no-spill test compiles

    for d, hk, g, page, bf16 in SHAPES:
        q, cache = _shape(d, hk, g, page, bf16)
        builds = [("90", cuda_decode.DEFAULT)]
        if d <= 128:
            builds += [("90", cuda_decode.CudaConfig(kind="warp")), ("89", cuda_decode.CudaConfig(kind="warp"))]
        for arch, cfg in builds:
            yield (f"decode d{d} hk{hk} g{g} p{page} bf16={int(bf16)} sm{arch} {cfg.kind}",
                   cuda_decode.SOURCE_PATH.read_text(), cuda_decode.KERNELS[cfg.kind], arch,
                   cuda_decode.defines(q, cache, cfg))


def verify_builds():
    from test_mtp_verify import GRID, OTHER, PLAN_CFGS, PLANNED  # the builds the verify no-spill test compiles

    from sndr.kernels.turboquant_k8v4 import mtp_verify as mv
    from sndr.kernels.turboquant_k8v4._layout import Layout

    for d, hk, g, k, page, bf16, cfg in [s + (-1,) for s in GRID + OTHER] + PLANNED:
        sp = hk * Layout(d).slot_size_aligned
        c = mv.DEFAULT if cfg < 0 else PLAN_CFGS[cfg]
        yield (f"verify d{d} hk{hk} g{g} k{k} p{page} bf16={int(bf16)} cfg{cfg} sm90", mv.source(), mv.KERNEL, "90",
               mv.defines(hk * g, hk, d, page, sp, bf16, k + 1, c))


def main(argv=None) -> int:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default="", help="only builds whose label contains this")
    args = ap.parse_args(argv)
    builds = list(decode_builds()) + list(verify_builds())
    for label, src, name, arch, defs in builds:
        if args.only not in label:
            continue
        for fn, sass in sorted(sass_by_function(_cudart.compile_cubin(src, name, arch, defs, cache=False)).items()):
            print(f"{label} {fn} {hashlib.sha256(sass.encode()).hexdigest()[:16]} {len(sass.splitlines())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
