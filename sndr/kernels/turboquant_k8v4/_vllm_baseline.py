"""Load vLLM 0.32.0's own TurboQuant store and decode from copied source files.

Tests and the benchmark compare against vLLM's shipped kernels without
importing vLLM (heavy, and absent on the GPU host): the three files

    triton_decode_attention.py  triton_turboquant_decode.py  triton_turboquant_store.py

are copied out of the wheel into an ignored folder (``.baselines/``, never
committed) and executed here under their real module names, with minimal
stand-ins for the two vLLM modules they import (``vllm.triton_utils`` and
``vllm.platforms``). ``sys.modules`` is restored afterwards, so a real vLLM
in the same process is left alone.
"""

from __future__ import annotations

import os
import types
from pathlib import Path

from ... import env as sndr_env
from .._baseline import load_with_stubs

FILES = ("triton_decode_attention.py", "triton_turboquant_decode.py", "triton_turboquant_store.py")
_PKG = "vllm.v1.attention.ops"


def candidate_dirs(repo_root: Path | None = None) -> list[Path]:
    """Where the copied files may be: $SNDR_TQ_BASELINE, <repo>/.baselines/vllm032_tq, the sndr tree cache."""
    out = []
    if os.environ.get(sndr_env.TQ_BASELINE):
        out.append(Path(os.environ[sndr_env.TQ_BASELINE]))
    root = repo_root or Path(__file__).resolve().parents[3]
    out.append(root / ".baselines" / "vllm032_tq")
    from ... import caches  # the cache-root rule: code is never loaded from a cache another uid could change

    trees = caches.dir_path("trees", "tree cache", without="the cached 0.32.0 tree is not a baseline candidate")
    if trees is not None:
        out.append(trees / "vllm-0.32.0" / "vllm" / "v1" / "attention" / "ops")
    return out


def find_dir(repo_root: Path | None = None) -> Path | None:
    for d in candidate_dirs(repo_root):
        if all((d / f).is_file() for f in FILES):
            return d
    return None


class _Platform:
    @staticmethod
    def is_cuda_alike() -> bool:
        import torch

        return torch.cuda.is_available()

    @staticmethod
    def is_rocm() -> bool:
        return False

    @staticmethod
    def is_cuda() -> bool:
        import torch

        return torch.cuda.is_available()


def load(src: Path) -> types.SimpleNamespace:
    """Execute the copied files; return their store, decode and stage-2 objects."""
    import triton
    import triton.language as tl

    stubs: dict[str, types.ModuleType] = {}
    for name in ("vllm", "vllm.v1", "vllm.v1.attention", _PKG):
        m = types.ModuleType(name)
        m.__path__ = []  # a package, so submodules resolve through sys.modules
        stubs[name] = m
    tu = types.ModuleType("vllm.triton_utils")
    tu.__dict__.update(tl=tl, triton=triton)
    stubs["vllm.triton_utils"] = tu
    pl = types.ModuleType("vllm.platforms")
    pl.__dict__.update(current_platform=_Platform())
    stubs["vllm.platforms"] = pl

    loaded = load_with_stubs(_PKG, src, FILES, stubs)
    return types.SimpleNamespace(
        store=loaded["triton_turboquant_store"].triton_turboquant_store,
        decode=loaded["triton_turboquant_decode"].triton_turboquant_decode_attention,
        modules=loaded,
    )
