"""Load vLLM 0.32.0's own GDN decode kernels from copied source files.

Tests and the benchmark compare against vLLM's shipped Triton kernels without
importing vLLM (heavy, and absent on the GPU host). The two files

    fused_recurrent.py  fused_sigmoid_gating.py

of ``vllm/third_party/flash_linear_attention/ops/`` are copied verbatim out of
an install or the wheel into an ignored folder (``.baselines/vllm032_gdn``,
never committed)::

    python -m sndr.kernels.gdn._vllm_baseline --from SITE_PACKAGES_OR_WHEEL

and executed here under their real module names, with minimal stand-ins for
what they import (``vllm.triton_utils``; ``.op``'s ``exp`` and ``log``,
which are ``tl.exp`` / ``tl.log`` unless FLA_USE_FAST_OPS=1: ``_fla_op_stub``). ``sys.modules``
is restored afterwards, so a real vLLM in the same process is left alone.
:func:`source_sha256` hashes the two functions the way patch PK0003's binding
check does, so a test can prove the copies are the pinned code.
"""

from __future__ import annotations

import argparse
import os
import shutil
import types
import zipfile
from pathlib import Path

from ... import env as sndr_env
from .._baseline import load_with_stubs

FILES = ("fused_recurrent.py", "fused_sigmoid_gating.py")
# vLLM's gated RMSNorm kernel (layer_norm_fwd_kernel); copied beside the two, loaded on its own (load_norm)
NORM_FILE = "layernorm_guard.py"
_PKG = "vllm.third_party.flash_linear_attention.ops"
_REL = "vllm/third_party/flash_linear_attention/ops"
# vLLM's Qwen GDN layer and its op wrappers: read (never imported) by the layer harness test,
# tests/kernels/test_gdn_vllm_layer.py, which executes the layer's decode methods from them
LAYER_FILES = {"qwen_gdn_linear_attn.py": "vllm/model_executor/layers/mamba/gdn/qwen_gdn_linear_attn.py",
               "_custom_ops.py": "vllm/_custom_ops.py"}
FUNCTIONS = {
    "fused_recurrent_gated_delta_rule_packed_decode": "fused_recurrent.py",
    "fused_sigmoid_gating_delta_rule_update": "fused_sigmoid_gating.py",
}


def candidate_dirs(repo_root: Path | None = None) -> list[Path]:
    """$SNDR_GDN_BASELINE, <repo>/.baselines/vllm032_gdn, sndr's cached 0.32.0 tree."""
    out = []
    if os.environ.get(sndr_env.GDN_BASELINE):
        out.append(Path(os.environ[sndr_env.GDN_BASELINE]))
    root = repo_root or Path(__file__).resolve().parents[3]
    out.append(root / ".baselines" / "vllm032_gdn")
    from ... import caches  # the cache-root rule: code is never loaded from a cache another uid could change

    trees = caches.dir_path(sndr_env.CACHE_TREES, "tree cache", without="the cached 0.32.0 tree is not a baseline candidate")
    if trees is not None:
        out.append(trees / "vllm-0.32.0" / _REL)
    return out


def find_dir(repo_root: Path | None = None) -> Path | None:
    for d in candidate_dirs(repo_root):
        if all((d / f).is_file() for f in FILES):
            return d
    return None


def copy_from(src: Path, dest: Path) -> list[Path]:
    """Copy the kernel files, the norm's file and the layer files (:data:`LAYER_FILES`) from a
    site-packages folder, a vLLM tree root or a wheel into ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    pairs = [(f, f"{_REL}/{f}") for f in (*FILES, NORM_FILE)] + list(LAYER_FILES.items())
    out = []
    if src.is_file() and src.suffix == ".whl":
        with zipfile.ZipFile(src) as zf:
            for f, rel in pairs:
                (dest / f).write_bytes(zf.read(rel))
                out.append(dest / f)
        return out
    for f, rel in pairs:
        shutil.copyfile(src / rel, dest / f)
        out.append(dest / f)
    return out


def load_norm(src: Path):
    """vLLM's gated RMSNorm as the Qwen GDN layer runs it (``_rms_norm_gated_cuda``), or None.

    Only ``layer_norm_fwd_kernel`` is taken from the copied ``layernorm_guard.py``
    (the rest of that file needs vLLM's JIT-warmup machinery); it is launched as
    0.32.0's ``layer_norm_fwd`` / ``LayerNormFwdKernel.__call__`` launch it:
    ``rows_per_block = min(next_pow2(cdiv(M, 2 * SMs)), 4)``, grid
    ``(cdiv(M, rows_per_block), groups)``, ``num_warps = min(max(BLOCK_N // 256, 1), 8)``,
    a new float32 ``rstd`` per call, and the layer's ``reshape(-1, V)`` of its
    [tokens, HV, V] operands (a copy for the strided output gate, as in vLLM).
    """
    import ast
    import linecache

    import torch
    import triton
    import triton.language as tl

    path = src / NORM_FILE
    if not path.is_file():
        return None
    text = path.read_text(encoding="utf-8")
    node = next((n for n in ast.parse(text).body
                 if isinstance(n, ast.FunctionDef) and n.name == "layer_norm_fwd_kernel"), None)
    if node is None:
        return None
    start = min([d.lineno for d in node.decorator_list] + [node.lineno]) - 1
    seg = "\n".join(text.splitlines()[start: node.end_lineno])
    # Triton's @jit reads the kernel's source through inspect: register it with linecache
    name = f"<vllm 0.32.0 {NORM_FILE}: layer_norm_fwd_kernel>"
    body = "import triton\nimport triton.language as tl\n\n" + seg + "\n"
    linecache.cache[name] = (len(body), None, body.splitlines(True), name)
    ns: dict = {"triton": triton, "tl": tl, "__name__": "_vllm032_layer_norm_fwd_kernel"}
    exec(compile(body, name, "exec"), ns)  # noqa: S102 - vLLM's own kernel source, copied from its wheel
    kernel = ns["layer_norm_fwd_kernel"]

    def rms_norm_gated(x, output_gate, out, weight, eps: float, activation: str = "silu"):
        v = x.shape[-1]
        x2, z2, o2 = x.reshape(-1, v), output_gate.reshape(-1, v), out.reshape(-1, v)
        m = x2.shape[0]
        sms = torch.cuda.get_device_properties(x.device).multi_processor_count if x.is_cuda else 1
        rows = min(triton.next_power_of_2(triton.cdiv(m, 2 * sms)), 4)
        block_n = min(65536 // x2.element_size(), triton.next_power_of_2(v))
        rstd = torch.empty((m,), dtype=torch.float32, device=x.device)
        kernel[(triton.cdiv(m, rows), 1)](
            x2, o2, weight.contiguous(), None, z2, None, rstd, x2.stride(0), o2.stride(0), z2.stride(0), m, v, eps,
            BLOCK_N=block_n, ROWS_PER_BLOCK=rows, HAS_BIAS=False, HAS_Z=True, NORM_BEFORE_GATE=True,
            IS_RMS_NORM=True, ACTIVATION=activation, num_warps=min(max(block_n // 256, 1), 8))
        if o2.data_ptr() != out.data_ptr():
            out.copy_(o2.view_as(out))
        return out

    return rms_norm_gated


def source_sha256(src: Path) -> dict[str, str]:
    """sha256 of each function's source segment, as ``sndr.binding.find_binding`` computes it."""
    from sndr.binding import find_binding

    out = {}
    for fn, f in FUNCTIONS.items():
        b = find_binding((src / f).read_text(encoding="utf-8"), fn, f)
        out[fn] = b.source_sha256 if b is not None else ""
    return out


def load(src: Path) -> types.SimpleNamespace:
    """Execute the copied files; return vLLM's two functions (and the modules)."""
    import triton
    import triton.language as tl

    stubs: dict[str, types.ModuleType] = {}
    for name in ("vllm", "vllm.third_party", "vllm.third_party.flash_linear_attention", _PKG):
        m = types.ModuleType(name)
        m.__path__ = []  # a package, so submodules resolve through sys.modules
        stubs[name] = m
    tu = types.ModuleType("vllm.triton_utils")
    tu.__dict__.update(
        tl=tl, triton=triton,
        tldevice=getattr(tl.extra, "libdevice", None) if hasattr(tl, "extra") else None,
    )
    stubs["vllm.triton_utils"] = tu
    from . import _fla_op_stub

    stubs[f"{_PKG}.op"] = _fla_op_stub

    loaded = load_with_stubs(_PKG, src, FILES, stubs)
    return types.SimpleNamespace(
        packed_decode=loaded["fused_recurrent"].fused_recurrent_gated_delta_rule_packed_decode,
        sigmoid_gating_update=loaded["fused_sigmoid_gating"].fused_sigmoid_gating_delta_rule_update,
        modules=loaded,
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--from", dest="src", required=True, type=Path,
                    help="site-packages (or a tree root) holding vllm/, or a vLLM wheel")
    ap.add_argument("--to", type=Path, default=Path(__file__).resolve().parents[3] / ".baselines" / "vllm032_gdn")
    args = ap.parse_args(argv)
    for p in copy_from(args.src, args.to):
        print(p)
    for fn, h in source_sha256(args.to).items():
        print(f"{fn}: sha256 {h}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
